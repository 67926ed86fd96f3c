"""``python -m data_gen.feature_draft``: now ``python -m model_build.feature_draft`` (:mod:`data_gen.renamed`)."""

from data_gen.renamed import forward

forward("data_gen.feature_draft", "model_build.feature_draft")
