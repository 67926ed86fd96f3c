"""Evaluation of length policies; the entry point is :mod:`accept_heads.evaluate`. One job per module:

* :mod:`~accept_heads.evaluation.inputs` — the prompt sets and the exported heads / SV profiles;
* :mod:`~accept_heads.evaluation.plan` — which runs to decode (dev sweeps, then the dev choices on test / OOD);
* :mod:`~accept_heads.evaluation.runs` — a run's spec and records, the runner protocol, our decoder's runner;
* :mod:`~accept_heads.evaluation.baselines` — the HF assisted-generation and Speculative Ensemble runners;
* :mod:`~accept_heads.evaluation.executor` — each family's runner, in this process or in worker processes;
* :mod:`~accept_heads.evaluation.cost_models`, :mod:`~accept_heads.evaluation.table`,
  :mod:`~accept_heads.evaluation.bootstrap` — the cost models, the results table, its intervals;
* :mod:`~accept_heads.evaluation.reliability` — the heads' dev predictions and reliability statistics;
* :mod:`~accept_heads.evaluation.results`, :mod:`~accept_heads.evaluation.report`,
  :mod:`~accept_heads.evaluation.figures` — saving / loading (the notebooks start there), terminal output, figures.
"""
