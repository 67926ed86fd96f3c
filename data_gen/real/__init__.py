"""The old name of :mod:`model_build.real`: ``python -m data_gen.real`` still works for this release
(:mod:`data_gen.renamed`)."""
