"""The evaluation's two cost models (DESIGN §5): the latency measurement behind them and the forward-time fit.

* ``cost`` (:func:`pricing`, by ``cost.source``), what the dev selection, the heads' ``h`` and the goodput stops
  price by:

  - ``configured`` (default; the paper's 7B/70B pair): ``t_d``, ``t_t`` as configured; the paper measured no
    companion, so ``t_c = t_d · (t_c/t_d measured here)`` (one-call latencies of our companion and draft);
    verification latency flat in ``L`` (the paper's ``t_t`` is per target call, at batch size 1 where latency is
    nearly flat, DESIGN §3);
  - ``measured`` (the real pair): every price from this machine's stored cost profile
    (:func:`~accept_heads.measure.machine_costs.machine_profile`, compiled forwards where ``decoding.compile``):
    ``t_t = T(2)`` with ``shape(L) = T(L + 1) / T(2)`` (a round verifying ``L`` candidates feeds ``L + 1`` tokens),
    the target alone ``T(1)``, ``t_d`` and ``t_c`` the draft's and the companion's one-token steps.
* ``fitted``: ``t_d``, ``t_c``, ``t_t`` fitted on the measured wall times of our decoder's runs, with the
  latency shape measured at the start of the evaluation on this device (:func:`measure_latency`, the
  SV profile's :func:`verification_latency`; a profile's own table may come
  from another device and stops at its ``k_max``).

Both price the target decoding alone (the "× target alone" speed-ups) at its own step, not at a
verification call: ``cost.t_target_alone`` (the paper's 0.108 s against its 0.112 s ``t_t``), and the
fitted ``t_t`` times the measured ratio of a one-token forward to a verification forward.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor
from transformers import PreTrainedModel

from accept_heads.measure.machine_costs import CostsSource, machine_profile
from ahconf.schema import CostConfig
from decode.batch_costs import CostProfile
from decode.costs import CostModel, LatencyShape, SourcePrice
from decode.json_types import JSONDict
from decode.threads import torch_threads
from decode.timing import forward_seconds
from runtime.models import Trio


@dataclass(frozen=True)
class Latency:
    """Forward times measured on this device before decoding (median of ``repeats`` after a warm-up)."""

    target_s: list[float]  # [L_max] target forward over L + 1 tokens on a cached prompt, L = 1..L_max
    target_alone_s: float  # target forward over one token on the same cache: a step of the target alone
    draft_s: float  # draft forward over 2 tokens on the same cache
    companion_s: float | None  # the same for the companion (None: no companion)
    device: str
    prompt_tokens: int
    repeats: int

    @property
    def shape(self) -> LatencyShape:
        """``latency(L) / latency(1)``: the fitted model's latency shape."""
        return LatencyShape(tuple(t / self.target_s[0] for t in self.target_s))

    @property
    def alone_ratio(self) -> float:
        """A target-alone step over a verification call of one candidate (``t_alone / t_t``), measured here."""
        return self.target_alone_s / self.target_s[0]

    @property
    def companion_ratio(self) -> float | None:
        """``t_c / t_d`` of one call each (None without a companion)."""
        return None if self.companion_s is None else self.companion_s / self.draft_s

    def to_dict(self) -> dict[str, object]:
        return {"source": ("measured at the start of the evaluation "
                           "(accept_heads.measure.cost_models.verification_latency)"),
                "device": self.device, "prompt_tokens": self.prompt_tokens, "repeats": self.repeats,
                "target_s": self.target_s, "target_alone_s": self.target_alone_s, "alone_ratio": self.alone_ratio,
                "shape": list(self.shape.values), "draft_s": self.draft_s,
                "companion_s": self.companion_s, "companion_ratio": self.companion_ratio}


def verification_latency(target: PreTrainedModel, prompt: list[int], k_max: int, repeats: int) -> Tensor:
    """Median seconds of a target forward over ``L + 1`` tokens on a cached ``prompt``, for ``L = 1..k_max``
    (:func:`decode.timing.forward_seconds`)."""
    widths = range(2, k_max + 2)
    return torch.tensor(forward_seconds(target, torch.tensor([prompt]), widths, repeats), dtype=torch.float64)


def device_description(device: torch.device) -> str:
    """``cpu`` or e.g. ``cuda:0 (NVIDIA H100 80GB HBM3)``: where a latency profile was measured."""
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return str(device)


def one_call_seconds(model: PreTrainedModel, prompt: list[int], repeats: int) -> float:
    """Median seconds of one decoding call (2 new tokens on a cached ``prompt``)."""
    return float(verification_latency(model, prompt, 1, repeats)[0])


def measure_latency(trio: Trio, prompt: list[int], lengths: int, repeats: int) -> Latency:
    """Target verification latency for ``L = 1..lengths`` and one draft / companion call on ``prompt``."""
    target = verification_latency(trio.target, prompt, lengths, repeats).tolist()
    alone = forward_seconds(trio.target, torch.tensor([prompt]), [1], repeats)[0]
    companion = one_call_seconds(trio.companion, prompt, repeats) if trio.companion is not None else None
    return Latency(target, alone, one_call_seconds(trio.draft, prompt, repeats), companion,
                   device_description(trio.target.device), len(prompt), repeats)


def configured_model(cost: CostConfig, companion_ratio: float | None) -> CostModel:
    """The ``cost`` model: the configured pair, flat latency, and ``cost.t_companion`` — when null,
    ``t_d`` times the measured ``companion_ratio`` (``t_c/t_d``; ``t_d`` without a companion)."""
    t_companion = cost.t_companion
    if t_companion is None:
        t_companion = cost.t_draft * (1.0 if companion_ratio is None else companion_ratio)
    return CostModel(cost.t_draft, cost.t_target, t_companion, t_target_alone=cost.t_target_alone)


def companion_price_source(cost: CostConfig) -> str:
    """Where :func:`configured_model` takes ``t_c`` from, as the report and the metadata say it."""
    return "cost.t_companion" if cost.t_companion is not None else "t_d x the companion/draft call ratio measured here"


@dataclass(frozen=True)
class StoredProfile:
    """The machine's cost profile a measured ``cost`` model prices from, and the file it is stored in."""

    profile: CostProfile
    stored: CostsSource  # its file, whether this run measured it, and what its prices depend on

    def to_dict(self) -> JSONDict:
        return {"profile": self.profile.to_dict(), "stored": self.stored.to_dict()}

    @classmethod
    def from_dict(cls, data: JSONDict) -> StoredProfile:
        """Inverse of :meth:`to_dict`."""
        return cls(CostProfile.from_dict(data["profile"]), CostsSource(**data["stored"]))


@dataclass(frozen=True)
class Pricing:
    """A cost model and what every table modelled at it says of it: the ``cost`` model (``cost.source``, what the
    selection prices by) or the one fitted on this machine's wall times (:func:`fitted_pricing`)."""

    model: CostModel
    source: str  # where the prices come from: cost.source (configured, measured) or fitted
    caption: str  # which costs: the configured pair, or the machine class, dtype and ratios they were measured with
    t_companion_from: str  # where t_c comes from
    assumes: str  # what the model assumes, in words (the results' metadata)
    profile: StoredProfile | None = None  # measured: the profile and its stored file

    @property
    def record(self) -> JSONDict:
        """The prices and where they come from (a head's threshold choice, the levers, the results' metadata)."""
        return {"source": self.source, "caption": self.caption, **self.model.to_dict(),
                "t_companion_from": self.t_companion_from}

    def to_dict(self) -> JSONDict:
        """The results' metadata: :attr:`record`, what the model assumes, and the profile where there is one."""
        return {**self.record, "assumes": self.assumes,
                **({"profile": self.profile.to_dict()} if self.profile is not None else {})}

    @classmethod
    def from_dict(cls, data: JSONDict) -> Pricing:
        """Inverse of :meth:`to_dict`."""
        profile = data.get("profile")
        return cls(CostModel.from_dict(data), data["source"], data["caption"], data["t_companion_from"],
                   data["assumes"], None if profile is None else StoredProfile.from_dict(profile))


def pricing(cost: CostConfig, trio: Trio, companion_ratio: Callable[[], float | None], *, compiled: bool,
            repeats: int, threads: int | None, sources: Mapping[str, SourcePrice] | None = None) -> Pricing:
    """The ``cost`` model of ``trio``: :func:`configured_model` (``companion_ratio()`` read only where
    ``cost.t_companion`` is null; the paper's pair prices no acceptance source's own compute), or this machine's
    stored cost profile at ``threads`` torch threads (the stages' ``decoding.threads``; None: as many as now),
    measured now where there is none, with ``repeats`` timed forwards per shape; compiled forwards where ``compiled``
    and the models compile here; each acceptance source at its price in ``sources``, measured here
    (:func:`~accept_heads.measure.source_prices.measure_source_prices`; None: every source free)."""
    if cost.source == "measured":
        with torch_threads(threads):
            profile, stored = machine_profile(trio.target, trio.draft, trio.companion,
                                              models=trio.description.to_dict(), repeats=repeats, compiled=compiled)
        fast = compiled and profile.compiled is not None
        caption = profile.caption(fast)
        model = profile.cost_model(fast)
        priced = "every acceptance source" if sources else "no acceptance source"
        if sources:
            model = model.with_sources(sources)
        return Pricing(model, cost.source, caption, "the companion's one-token step, measured",
                       "every price from this machine's cost profile: t_t = T(2) (a verification of one candidate), "
                       "latency_shape(L) = T(L + 1) / T(2), the target alone at T(1), t_d and t_c one-token steps; "
                       f"{priced} at its estimate's and its online fit's measured seconds (sources)",
                       StoredProfile(profile, stored))
    model = configured_model(cost, companion_ratio() if cost.t_companion is None else None)
    caption = (f"the cost pair t_d = {model.t_draft:g} s, t_t = {model.t_target:g} s, t_c = {model.t_companion:.4g} s "
               "(flat in L)")
    return Pricing(model, cost.source, caption, companion_price_source(cost),
                   "cost.* pair; t_companion from t_companion_from (the paper measures no companion); verification "
                   "latency flat in L (latency_shape [1]); the target alone at cost.t_target_alone (null: t_target); "
                   "no acceptance source's own compute priced (the paper's pair prices none)")


@dataclass(frozen=True)
class CostFit:
    """No-intercept least squares of ``seconds ≈ t_d·N_d + t_c·N_c + t_t·Σ_r shape(L_r)`` over ``n`` runs.

    ``r2`` is uncentred (``1 − SS_res / Σ seconds²``), the R² of a fit without intercept.
    ``companion_runs``: runs with companion calls; with none ``t_companion`` is not identified (0).
    """

    t_draft: float
    t_companion: float
    t_target: float
    r2: float
    n: int
    companion_runs: int

    def model(self, latency: LatencyShape, alone_ratio: float | None = None) -> CostModel:
        """The fitted cost model (with the shape its verification regressor was built from); the target alone
        at ``t_t × alone_ratio`` (a one-token forward over a verification forward, measured; None: ``t_t``)."""
        alone = None if alone_ratio is None else self.t_target * alone_ratio
        return CostModel(self.t_draft, self.t_target, self.t_companion, latency, t_target_alone=alone)

    def to_dict(self) -> dict[str, float | int | str]:
        return {"t_draft": self.t_draft, "t_companion": self.t_companion, "t_target": self.t_target, "r2": self.r2,
                "r2_definition": "uncentred (no intercept): 1 - SS_res / sum(seconds^2)", "n": self.n,
                "companion_runs": self.companion_runs}


def fitted_pricing(fit: CostFit, latency: Latency, sources: Mapping[str, SourcePrice]) -> Pricing:
    """The model ``fit`` found, with the latency shape measured at the start and each acceptance source at its
    measured ``sources`` price (the fit ran on wall times less those seconds), as the results describe it."""
    return Pricing(fit.model(latency.shape, latency.alone_ratio).with_sources(sources), "fitted",
                   "the fitted t_d, t_c, t_t(L)",
                   "fitted (cost_fit; 0 when no run calls the companion)",
                   "t_d, t_c, t_t fitted (cost_fit); latency_shape measured on this device at the start (latency); the "
                   "target alone at t_t x latency.alone_ratio (a one-token forward over a verification forward, "
                   "measured); every acceptance source at its measured seconds (sources), the fit on wall times less "
                   "them")


def fit_costs(draft_calls: np.ndarray, companion_calls: np.ndarray, verification_units: np.ndarray,
              seconds: np.ndarray) -> CostFit:
    """Fit ``t_d``, ``t_c``, ``t_t`` (``verification_units``: each run's ``Σ_r shape(L_r)``)."""
    x = np.stack([np.asarray(v, float) for v in (draft_calls, companion_calls, verification_units)], axis=1)
    y = np.asarray(seconds, float)
    if y.size < 3:
        raise ValueError(f"the cost fit needs at least 3 runs (draft, companion, verification, time), got {y.size}")
    coefficients, *_ = np.linalg.lstsq(x, y, rcond=None)  # minimum norm: t_c = 0 when no run calls the companion
    residual = float(((y - x @ coefficients) ** 2).sum())
    total = float((y**2).sum())
    r2 = 1.0 - residual / total if total > 0 else float(residual == 0)
    t_draft, t_companion, t_target = (float(c) for c in coefficients)
    return CostFit(t_draft, t_companion, t_target, r2, int(y.size), int((x[:, 1] > 0).sum()))
