"""Measuring our decoder on prompt sets: what the levers and the evaluation share, and the latency and information
measures training reads.

* :mod:`~accept_heads.measure.inputs` — the prompt sets and the exported heads / SV profiles;
* :mod:`~accept_heads.measure.specs`, :mod:`~accept_heads.measure.families` — the run policies and their families;
* :mod:`~accept_heads.measure.runs` — a run's spec and records, the runner protocol, our decoder's runner;
* :mod:`~accept_heads.measure.placement` — which prompts decode alone;
* :mod:`~accept_heads.measure.cost_models`, :mod:`~accept_heads.measure.machine_costs`,
  :mod:`~accept_heads.measure.costing` — the cost models and a run's modelled throughput;
* :mod:`~accept_heads.measure.bootstrap` — paired bootstrap draws and intervals over prompts;
* :mod:`~accept_heads.measure.selection` — choosing a swept value (K, τ, h, γ, T).

Training (:mod:`accept_heads.training`) and the evaluation (:mod:`accept_heads.evaluation`) import it; it imports
neither.
"""
