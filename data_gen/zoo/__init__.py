"""The old name of :mod:`model_build.zoo`: ``python -m data_gen.zoo`` still works for this release
(:mod:`data_gen.renamed`)."""
