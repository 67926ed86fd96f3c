"""Evaluation of length policies; the entry point is :mod:`accept_heads.evaluate`. One job per module:

* :mod:`~accept_heads.evaluation.evaluation_plan`, :mod:`~accept_heads.evaluation.plan` — what an evaluation decodes
  (dev sweeps, then the dev choices on test / OOD);
* :mod:`~accept_heads.evaluation.h_choice` — each head's ``h`` chosen on dev, recorded beside it, reused;
* :mod:`~accept_heads.evaluation.baselines` — the HF assisted-generation and Speculative Ensemble runners;
* :mod:`~accept_heads.evaluation.executor` — each family's runner, in this process or in worker processes;
* :mod:`~accept_heads.evaluation.table`, :mod:`~accept_heads.evaluation.intervals` — the results table, its
  intervals;
* :mod:`~accept_heads.evaluation.reliability` — the heads' dev predictions and reliability statistics;
* :mod:`~accept_heads.evaluation.results`, :mod:`~accept_heads.evaluation.report`,
  :mod:`~accept_heads.evaluation.figures` — saving / loading (the notebooks start there), terminal output, figures.

What it shares with training and the levers (prompt sets, runs, cost models, the bootstrap's draws, the choice of a
swept value) lives below it, in :mod:`accept_heads.measure`; nothing outside this package and
:mod:`accept_heads.evaluate` imports it.
"""
