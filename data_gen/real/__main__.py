"""``python -m data_gen.real``: now ``python -m model_build.real`` (:mod:`data_gen.renamed`)."""

from data_gen.renamed import forward

forward("data_gen.real", "model_build.real")
