"""Training of heads and SV profiles; the entry point is :mod:`accept_heads.train`. One job per module:

* :mod:`~accept_heads.training.training_data`, :mod:`~accept_heads.training.features` — the collected data and the
  head's features;
* :mod:`~accept_heads.training.module`, :mod:`~accept_heads.training.metrics`, :mod:`~accept_heads.training.loggers`
  — the Lightning module, its metrics and loggers;
* :mod:`~accept_heads.training.profile_fit` — fitting an SV profile;
* :mod:`~accept_heads.training.export`, :mod:`~accept_heads.training.outcomes`,
  :mod:`~accept_heads.training.run_summary` — where artifacts go and their metadata, what a job hands back, the summary.

It imports :mod:`accept_heads.measure` (a latency measurement, the information measures), never
:mod:`accept_heads.evaluation`.
"""
