"""Evaluation of length policies: decoding sweeps, the cost model fit, the results table, HF baselines, figures.

The entry point is :mod:`accept_heads.evaluate`; :mod:`accept_heads.evaluation.results` loads what it saved
(the notebooks start there) and :mod:`accept_heads.evaluation.figures` draws from it.
"""
