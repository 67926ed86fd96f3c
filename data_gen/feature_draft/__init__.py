"""The old name of :mod:`model_build.feature_draft`: ``python -m data_gen.feature_draft`` still works for this release
(:mod:`data_gen.renamed`)."""
