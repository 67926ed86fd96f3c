"""``python -m data_gen.zoo``: now ``python -m model_build.zoo`` (:mod:`data_gen.renamed`)."""

from data_gen.renamed import forward

forward("data_gen.zoo", "model_build.zoo")
