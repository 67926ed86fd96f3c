"""Stop rules of the estimate-driven length policies: whether to draft on, given the acceptance so far (DESIGN §2).

A stop rule sees numbers only: the latest candidate's index ``i``, the running keep-probability
``Π_i = Π_{j≤i} P̂_j`` and the latest estimate ``P̂_i``. Whatever supplies ``P̂`` (a trained head, the truth in
hindsight, a training-free source) is an acceptance source (:mod:`decode.policies.sources`) of a
:class:`~decode.policies.stop_policy.StopPolicy`, which keeps ``Π`` and asks its rule. :class:`Threshold` is
SpecDec++'s swept ``h``; :class:`Goodput` derives the stop from the costs, alone or, with measured batch costs, for a
batch as a whole; :class:`SurvivalStop` leaves the stop to the batch's survival budget (DESIGN §7).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from decode.batch_costs import BatchCosts
from decode.costs import FREE, CostModel
from decode.policies.base import DEFAULT_K_MAX, PolicyInputs, registrar


class StopRule:
    """Base class: a stop with a drafting range ``k_min ≤ i ≤ k_max`` and per-generation state.

    A registered rule (:func:`register_stop`) makes a policy kind with each acceptance source
    (:data:`~decode.policies.sources.SOURCES`).
    """

    #: Its name in policy kinds (``<source>-<name>``) and tables.
    name: ClassVar[str]
    #: The constructor argument a kind's one parameter sets (the threshold ``h``; None: it takes none).
    parameter: ClassVar[str | None] = None
    #: Its rows decide together at measured batch costs: a batch decodes it, never one prompt alone.
    batch_only: ClassVar[bool] = False

    @classmethod
    def build(cls, value: float | None, inputs: PolicyInputs, kind: str, companion: bool, k_min: int,
              k_max: int) -> StopRule:
        """The rule of a ``kind`` run over ``k_min..k_max`` from its parameter ``value`` and ``inputs``
        (``companion``: its source calls the companion every step)."""
        raise NotImplementedError

    def __init__(self, k_min: int = 1, k_max: int = DEFAULT_K_MAX) -> None:
        if not 1 <= k_min <= k_max:
            raise ValueError(f"{type(self).__name__} needs 1 <= k_min <= k_max, got {k_min}, {k_max}")
        self.k_min, self.k_max = k_min, k_max

    def reset(self) -> None:
        """Forget this generation's state (called at the start of every generation)."""

    def stops(self, i: int, keep: float, accept: float) -> bool:
        """Whether drafting stops after ``y_i`` (kept), at the running ``Π_i`` and the latest ``P̂_i``."""
        raise NotImplementedError

    def next_pays(self, i: int, keep: float, forecast: float) -> bool:
        """Whether drafting ``y_{i+1}`` pays at ``Π_i`` and a forecast ``F̂_{i+1}`` of its acceptance."""
        raise NotImplementedError

    def end_round(self, drafted: int, verified: int, accepted: int, extra_draft_call: bool) -> None:
        """Feedback after verification; ``extra_draft_call``: the draft consumed ``y_i`` before the stop read it."""

    def price_source(self, key: str | None) -> None:
        """Learn the price key of the source it stops on (a rule that prices its rounds prices the source too)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(k_min={self.k_min}, k_max={self.k_max})"


#: Every stop rule by name, in registration order (:func:`register_stop` adds to it).
STOPS: dict[str, type[StopRule]] = {}
#: Class decorator: add a stop rule to :data:`STOPS` under its ``name``.
register_stop = registrar(STOPS, "stop rule")


@register_stop
class Threshold(StopRule):
    """SpecDec++'s rule: keep drafting while ``1 − Π_i ≤ threshold``."""

    name = "h"
    parameter = "threshold"

    def __init__(self, threshold: float = 0.5, k_min: int = 1, k_max: int = DEFAULT_K_MAX) -> None:
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"Threshold needs threshold in [0, 1], got {threshold}")
        super().__init__(k_min, k_max)
        self.threshold = threshold

    @classmethod
    def build(cls, value: float | None, inputs: PolicyInputs, kind: str, companion: bool, k_min: int,
              k_max: int) -> Threshold:
        return cls(float(value), k_min, k_max)

    def stops(self, i: int, keep: float, accept: float) -> bool:
        return i >= self.k_min and 1.0 - keep > self.threshold

    def next_pays(self, i: int, keep: float, forecast: float) -> bool:
        return 1.0 - keep * forecast <= self.threshold

    def __repr__(self) -> str:
        return f"Threshold(threshold={self.threshold}, k_min={self.k_min}, k_max={self.k_max})"


@register_stop
class Goodput(StopRule):
    """Drafting ``y_{i+1}`` pays while the expected tokens it adds, ``Π_i·P̂``, exceed the throughput ``λ``
    achieved so far times its marginal cost (:func:`drafting_pays`; no threshold to tune).

    ``λ`` counts the round's calls as the decoder does (``end_round``). With measured ``batch_costs`` and inside
    the batched loop (:meth:`join_batch`) the rule is taken for the batch as a whole: the rule only records its
    ``outlook`` (and the first candidates' mean ``P̂``, the next round's :attr:`forecast`) and
    :class:`~decode.policies.batch_plans.BatchGoodput` stops the rows together.
    """

    name = "goodput"

    def __init__(self, costs: CostModel, k_min: int = 1, k_max: int = DEFAULT_K_MAX, batch_costs: BatchCosts | None = None,
                 companion: bool = False) -> None:
        super().__init__(k_min, k_max)
        self.costs, self.batch_costs, self.companion = costs, batch_costs, companion
        self.source_price = FREE  # its source's own compute (price_source)
        self.reset()

    @classmethod
    def build(cls, value: float | None, inputs: PolicyInputs, kind: str, companion: bool, k_min: int,
              k_max: int) -> Goodput:
        """At the measured batch costs' batch-1 model with them (the batch then decides together), else at
        ``inputs.costs``."""
        costs, batch_costs = inputs.goodput_costs(kind)
        return cls(costs, k_min, k_max, batch_costs, companion=companion)

    def reset(self) -> None:
        self.tokens, self.seconds = 0, 0.0
        self.in_batch = False
        #: In a batch: the row's running keep-probability and latest ``P̂`` (read by :func:`batch_drafting_pays`).
        self.outlook: tuple[float, float] = (0.0, 0.0)
        self._first_sum, self._first_count = 0.0, 0

    def join_batch(self) -> None:
        """Leave the stop to the batch for this generation."""
        self.in_batch = True

    @property
    def forecast(self) -> float | None:
        """The mean ``P̂`` of this generation's first candidates so far (None before the first)."""
        return self._first_sum / self._first_count if self._first_count else None

    @property
    def throughput(self) -> float:
        """``λ``: tokens per modelled second so far in this generation (``1 / t_t`` before the first round)."""
        return self.tokens / self.seconds if self.seconds > 0 else 1.0 / self.costs.t_target

    def price_source(self, key: str | None) -> None:
        self.source_price = self.costs.price(key)

    def step_cost(self) -> float:
        """Draft (and companion) seconds per drafted candidate, and its source's estimate of it."""
        return self.costs.t_draft + (self.costs.t_companion if self.companion else 0.0) + self.source_price.estimate

    def marginal_cost(self, i: int) -> float:
        """Seconds the ``(i+1)``-th candidate adds: its drafting step and one more verified position."""
        shape = self.costs.latency
        return self.step_cost() + self.costs.t_target * float(shape(i + 1) - shape(i))

    def stops(self, i: int, keep: float, accept: float) -> bool:
        if i == 1:
            self._first_sum, self._first_count = self._first_sum + accept, self._first_count + 1
        if self.batch_costs is not None and self.in_batch:
            self.outlook = (keep, accept)
            return False
        return i >= self.k_min and not drafting_pays([(keep, accept)], i, self.k_max, self.throughput,
                                                     self.marginal_cost)

    def next_pays(self, i: int, keep: float, forecast: float) -> bool:
        return drafting_pays([(keep, forecast)], i, self.k_max, self.throughput, self.marginal_cost)

    def end_round(self, drafted: int, verified: int, accepted: int, extra_draft_call: bool) -> None:
        self.tokens += accepted + 1
        self.seconds += (drafted * self.step_cost() + extra_draft_call * self.costs.t_draft
                         + self.costs.t_target * float(self.costs.latency(verified)) + self.source_price.update)


@register_stop
class SurvivalStop(StopRule):
    """The stop of a row whose batch decides for it (:class:`~decode.policies.batch_plans.SurvivalBudget`, at
    measured ``costs``): alone it never stops before ``k_max``."""

    name = "budget"
    batch_only = True

    def __init__(self, costs: BatchCosts, k_min: int = 1, k_max: int = DEFAULT_K_MAX) -> None:
        super().__init__(k_min, k_max)
        self.costs = costs

    @classmethod
    def build(cls, value: float | None, inputs: PolicyInputs, kind: str, companion: bool, k_min: int,
              k_max: int) -> SurvivalStop:
        if inputs.batch_costs is None:
            raise ValueError(f"a {kind} policy decides at measured batch costs (PolicyInputs.batch_costs): the "
                             "evaluation's batch axis measures them")
        return cls(inputs.batch_costs, k_min, k_max)

    def stops(self, i: int, keep: float, accept: float) -> bool:
        return False

    def next_pays(self, i: int, keep: float, forecast: float) -> bool:
        return True


def drafting_pays(outlooks: list[tuple[float, float]], i: int, k_max: int, throughput: float,
                  step_cost: Callable[[int], float]) -> bool:
    """Whether drafting on from ``i`` to some ``j ≤ k_max`` adds more expected tokens than ``λ`` × its cost.

    ``outlooks``: per drafting row, its keep-probability ``Π_i`` and latest ``P̂``; its candidate ``m``
    after ``i`` is kept with ``Π_i·P̂^m`` (``P̂`` standing in for the unseen ones). ``step_cost(n)``
    is the price of the ``(n+1)``-th drafting step. Looking past the next step matters where
    verification costs are not convex in the length (a CPU's forward often costs the same for 3 and
    for 8 tokens); with costs linear in the length it is the one-step rule.
    """
    gain, cost = 0.0, 0.0
    keeps = [keep for keep, _ in outlooks]
    for n in range(i, k_max):
        keeps = [keep * accept for keep, (_, accept) in zip(keeps, outlooks)]
        gain += sum(keeps)
        cost += step_cost(n)
        if gain >= throughput * cost:
            return True
    return False


def _batch_step_cost(stops: list[Goodput], batch: int) -> Callable[[int], float]:
    """A batch drafting step's price: a draft forward of the drafting rows plus one more verification column
    for all ``batch`` live rows, ``t_v(B, B·(n+1)) − t_v(B, B·n)``."""
    costs = stops[0].batch_costs

    def step_cost(n: int) -> float:
        return costs.draft_time(len(stops)) + batch * costs.marginal_candidate(batch, n)

    return step_cost


def batch_drafting_pays(stops: list[Goodput], i: int, batch: int, throughput: float) -> bool:
    """The batch-level goodput stop of the drafting rows' rules (with ``batch_costs``) after ``i`` drafting steps;
    the rows' ``k_min`` is honoured (the batch drafts on while ``i`` is below it)."""
    first = stops[0]
    if i < first.k_min:
        return True
    return drafting_pays([stop.outlook for stop in stops], i, first.k_max, throughput, _batch_step_cost(stops, batch))


def batch_opening_pays(stops: list[Goodput], batch: int, throughput: float) -> bool:
    """Whether a batch of goodput rows drafts at all this round.

    The first step costs a draft forward of the rows plus the first verification column over the
    target alone's step (``t_v(B, B) − t_t(B, B)``), later steps as in :func:`batch_drafting_pays`;
    each row's candidates are forecast by its :attr:`Goodput.forecast`. A row without a forecast
    yet (its first round) makes the batch draft.
    """
    forecasts = [stop.forecast for stop in stops]
    if any(forecast is None for forecast in forecasts):
        return True
    return drafting_pays([(1.0, forecast) for forecast in forecasts], 0, stops[0].k_max, throughput,
                         _batch_step_cost(stops, batch))
