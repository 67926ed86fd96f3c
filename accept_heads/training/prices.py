"""The goodput loss's prices (DESIGN §2, "A loss for the stop"): the configured ones, or this machine's measured cost
profile of the data's models, so a head trained for its stop is trained at the prices it is judged at."""

from __future__ import annotations

from dataclasses import replace

from accept_heads.measure.machine_costs import machine_profile
from ahconf.schema import TrainJob
from ahconf.schema.train import LossConfig
from decode.threads import torch_threads
from runtime.models import load_trio
from runtime.placement import place


def priced_loss(job: TrainJob) -> LossConfig:
    """``job.loss`` with the goodput prices it asks for: as configured, or (``loss.goodput_prices=measured``, a goodput
    term on) a draft step and ``T(L) / T(1)`` for ``L = 1..goodput_k`` read off this machine's stored cost profile of
    the trio (measured now where none is stored), in target calls verifying one candidate as the evaluation's
    ``cost.source=measured`` prices them: eager or compiled forwards as ``decoding.compile``, at its threads."""
    loss, d = job.loss, job.decoding
    if not loss.goodput_weight or loss.goodput_prices == "configured":
        return loss
    trio = load_trio(job.models, job.paths.zoo_dir, verify=d.verify)
    place(trio)
    with torch_threads(d.threads):
        profile, _ = machine_profile(trio.target, trio.draft, trio.companion, models=trio.description.to_dict(),
                                     repeats=d.repeats, compiled=d.compile)
    compiled = d.compile and profile.compiled is not None
    model = profile.cost_model(compiled)
    shape = [float(v) for v in model.latency(range(1, loss.goodput_k + 1))]
    priced = replace(loss, goodput_draft_cost=model.t_draft / model.t_target, goodput_verify_shape=shape)
    print(f"goodput prices, {profile.caption(compiled)}: a draft step {priced.goodput_draft_cost:.3f} of a "
          f"verification, T(L)/T(1) for L = 1..{loss.goodput_k}: {' '.join(f'{v:.3f}' for v in shape)}", flush=True)
    return priced
