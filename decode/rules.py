"""Verification rules (DESIGN §1): the single definition of acceptance for the whole project.

Every rule works on raw logits plus the run's :class:`~decode.sampling.Sampling` transform and
defines, vectorised over positions:

* the *verifier distribution* ``v`` (``p`` for speculative / fuzzy / greedy, ``r = E(q, p)`` for
  ensembles) — the distribution a lossless rule reproduces;
* the acceptance probability of a candidate ``y`` (this is also the training label ``a``);
* the distribution sampled at the first rejection, and the bonus distribution.

Decode-time use goes through :meth:`Rule.propose`, :meth:`Rule.verify` and (ensembles only)
:meth:`Rule.settle`; data collection uses :meth:`Rule.label`.

A rule's parameters are its dataclass fields with their defaults (:meth:`Rule.defaults`): a parameterised rule is
one declaration, and configs, collection, training and the evaluation read its parameters from it
(``from_spec(name, **params)``; DESIGN §1).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar, Protocol, TypedDict, TypeVar

import torch
from torch import Generator, Tensor

from decode.divergence import DIVERGENCES, tv
from decode.ensemble_fn import DEFAULT_MU, DEFAULT_WEIGHT, EnsembleFn
from decode.json_types import JSON
from decode.sampling import Sampling
from decode.tree import ROOT, DraftTree, without


def _positive_part_normalised(v: Tensor, q: Tensor) -> Tensor:
    """``norm(max(0, v − q))`` row-wise; rows with no positive mass fall back to ``v``."""
    residual = (v - q).clamp_min(0.0)
    mass = residual.sum(-1, keepdim=True)
    return torch.where(mass > 0, residual / mass.clamp_min(1e-30), v)


def _ratio_accept(v: Tensor, q: Tensor, y: Tensor) -> Tensor:
    """``min(1, v(y)/q(y))`` for each row."""
    vy = v.gather(-1, y.unsqueeze(-1)).squeeze(-1)
    qy = q.gather(-1, y.unsqueeze(-1)).squeeze(-1)
    return torch.where(qy > 0, (vy / qy.clamp_min(1e-30)).clamp(max=1.0), torch.ones_like(vy))


class SharedScores(Protocol):
    """What :meth:`Rule.label` reads of ``p_logits`` and ``q_logits`` when a caller computes it once for many rules.

    Data collection memoises both, so the label columns of every rule share one softmax per model
    and transform and one argmax per model.
    """

    def probs(self, transform: Sampling) -> tuple[Tensor, Tensor]:
        """``(transform.probs(p_logits), transform.probs(q_logits))``."""
        ...

    def argmax(self) -> tuple[Tensor, Tensor]:
        """``(p_logits.argmax(-1), q_logits.argmax(-1))``."""
        ...


def sample(probs: Tensor, generator: Generator | None) -> Tensor:
    """One token per row of ``probs`` ``[..., V]``, drawn on the generator's device.

    The project's one convention for randomness: every draw is made on the device of the generator
    that seeds it (the decoders create theirs on the target's device, collection on the models'),
    and tensors elsewhere (``device_map`` shards) are moved there for the draw and the result moved
    back. The same seed gives the same tokens on a given device.
    """
    device = probs.device if generator is None else generator.device
    return torch.multinomial(probs.to(device), 1, generator=generator).squeeze(-1).to(probs.device)


def uniform(shape: tuple[int, ...], generator: Generator | None, like: Tensor) -> Tensor:
    """``U(0, 1)`` draws of ``shape`` on the generator's device (see :func:`sample`), placed like ``like``."""
    device = like.device if generator is None else generator.device
    return torch.rand(shape, generator=generator, device=device).to(like.device)


#: Every rule by name, in definition order (:func:`register_rule` adds to it).
RULES: dict[str, type[Rule]] = {}

RuleClass = TypeVar("RuleClass", bound="type[Rule]")


class RuleSpec(TypedDict):
    """A rule as metadata, results and configs store it: its :attr:`Rule.name` and :meth:`Rule.params`."""

    name: str
    params: dict[str, JSON]


def register_rule(cls: RuleClass) -> RuleClass:
    """Class decorator: add a rule class to :data:`RULES` under its ``name``."""
    if cls.name in RULES and RULES[cls.name] is not cls:
        raise ValueError(f"rule {cls.name!r} is already registered by {RULES[cls.name].__name__}")
    RULES[cls.name] = cls
    return cls


@dataclass(eq=False, repr=False)
class Rule:
    """Base class: acceptance via ``u < accept_prob`` and sampling of the emitted token.

    A subclass declares its parameters as dataclass fields with defaults (``@dataclass(eq=False, repr=False)``
    keeps equality, hashing and the repr on :meth:`spec`); :attr:`swept` names the one an evaluation sweeps.
    """

    name: ClassVar[str]
    lossless: ClassVar[bool]
    #: The parameter that trades output quality for acceptance, swept on dev at the rule's chosen fixed K by the
    #: evaluation (FSD's threshold T; None: none).
    swept: ClassVar[str | None] = None
    #: True when a bonus token drawn from ``p`` must later be checked against ``q`` (ensembles).
    tentative_bonus: ClassVar[bool] = False
    #: True when the draft is a member of what is verified against, so no token is drawn where it has not scored:
    #: the token after a fully accepted round is drawn once the draft has (:meth:`complete`; the n-model ensemble).
    member_draft: ClassVar[bool] = False
    #: How a draft tree's siblings may be drawn for :meth:`verify_tree` to stay exact (decode.tree.SIBLING_DRAWS).
    tree_draws: ClassVar[tuple[str, ...]] = ("independent", "without-replacement")

    @classmethod
    def defaults(cls) -> dict[str, JSON]:
        """The parameters the rule declares, with their defaults (its dataclass fields)."""
        return {f.name: f.default for f in fields(cls)}

    @property
    def primary(self) -> str | None:
        """The parameter that tells this rule's configurations apart in results tables (``rule_param``): the swept
        one, else None."""
        return self.swept

    @property
    def value(self) -> float | None:
        """The :attr:`primary` parameter's value (None: none)."""
        return None if self.primary is None else float(getattr(self, self.primary))

    def with_value(self, value: float) -> Rule:
        """This rule with its :attr:`primary` parameter set to ``value`` (a point of a sweep)."""
        if self.primary is None:
            raise ValueError(f"rule {self.name!r} has no parameter to set to {value}")
        return replace(self, **{self.primary: value})

    def labelled(self) -> tuple[Rule, ...]:
        """The rules collection stores a label column for, for this one as configured: itself (the ensemble: each
        kind; none for fuzzy, whose labels are read off the stored divergences, :meth:`labels_from`)."""
        return (self,)

    @property
    def label_column(self) -> str:
        """The dataset column holding this rule's labels (DESIGN §1)."""
        return f"label_{self.name}"

    def labels_from(self, column: Tensor) -> Tensor:
        """The training labels from the values of :attr:`label_column`: the column itself."""
        return column

    # --- definitions on post-transform probabilities -------------------------------------------
    def transform(self, sampling: Sampling) -> Sampling:
        """The transform this rule actually applies (greedy overrides it)."""
        return sampling

    def verifier_probs(
        self, p_logits: Tensor, q_logits: Tensor, sampling: Sampling, p: Tensor | None = None
    ) -> Tensor:
        """The distribution the rule verifies against (``p`` by default).

        ``p``: ``self.transform(sampling).probs(p_logits)`` when the caller already holds it.
        """
        return self.transform(sampling).probs(p_logits) if p is None else p

    def accept_probs(self, v: Tensor, q: Tensor, y: Tensor) -> Tensor:
        """Probability of accepting candidate ``y`` at each row."""
        return _ratio_accept(v, q, y)

    def reject_probs(self, v: Tensor, q: Tensor) -> Tensor:
        """Distribution sampled at the first rejection."""
        return _positive_part_normalised(v, q)

    def expected_accept_probs(self, v: Tensor, q: Tensor) -> Tensor:
        """``E_{y~q}[accept_probs(y)]`` at each row: ``Σ_y min(v(y), q(y)) = 1 − TV(v, q)`` for the ratio rules."""
        return (1.0 - tv(v, q)).clamp(0.0, 1.0)

    # --- public API ------------------------------------------------------------------------------
    def expected_accept(self, p_logits: Tensor, q_logits: Tensor, sampling: Sampling | None = None) -> Tensor:
        """Probability that the *next* candidate is accepted, before it is drawn (vectorised over rows): DSpark's
        soft label ``1 − TV(v, q)`` for the ratio rules, the label of a head that decides before drafting a
        candidate (DESIGN §5)."""
        sampling = self.transform(sampling or Sampling())
        return self.expected_accept_probs(self.verifier_probs(p_logits, q_logits, sampling), sampling.probs(q_logits))

    def params(self) -> dict[str, JSON]:
        """Constructor parameters (JSON-ready) — with :attr:`name`, enough to rebuild the rule."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def spec(self) -> RuleSpec:
        """``{"name": ..., "params": {...}}`` as stored in metadata."""
        return {"name": self.name, "params": self.params()}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Rule) and self.spec() == other.spec()

    def __hash__(self) -> int:
        return hash((self.name, tuple(sorted(self.params().items()))))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({args})"

    def label(
        self, p_logits: Tensor, q_logits: Tensor, y: Tensor, sampling: Sampling | None = None, *,
        shared: SharedScores | None = None,
    ) -> Tensor:
        """Training label ``a_t`` for candidates ``y[T]`` given logits ``[T, V]`` (vectorised).

        ``shared``: the distributions of these logits, already computed (:class:`SharedScores`);
        without it they are computed here.
        """
        sampling = self.transform(sampling or Sampling())
        p, q = (None, sampling.probs(q_logits)) if shared is None else shared.probs(sampling)
        v = self.verifier_probs(p_logits, q_logits, sampling, p=p)
        return self.accept_probs(v, q, y)

    def propose(self, q_logits: Tensor, sampling: Sampling, generator: Generator | None) -> Tensor:
        """The draft's candidate from ``q`` logits ``[..., V]``: a sample of the transformed ``q``."""
        sampling = self.transform(sampling)
        if sampling.greedy:
            return q_logits.argmax(-1)
        return sample(sampling.probs(q_logits), generator)

    def verify(
        self, p_logits: Tensor, q_logits: Tensor, y: Tensor, sampling: Sampling, generator: Generator | None,
        draws: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Verify candidates ``y[L]`` with target logits ``[L+1, V]`` and draft logits ``[≥L, V]``.

        Returns ``(n_accepted, token)`` as 0-d tensors (no host sync): ``token`` is sampled from the
        rejection distribution at ``n_accepted`` or, when all are accepted, from the bonus
        distribution (``v_{L+1}`` when ``q_{L+1}`` is given, else ``p_{L+1}``; see
        :attr:`tentative_bonus`). ``draws``: the ``L`` acceptance uniforms, drawn in advance (a
        hindsight policy draws them with each candidate; DESIGN §5), else drawn here.
        """
        sampling = self.transform(sampling)
        n = y.shape[0]
        rows = min(n + 1, q_logits.shape[0])
        v = self.verifier_probs(p_logits[:rows], q_logits[:rows], sampling)
        q = sampling.probs(q_logits[:n])
        u = uniform((n,), generator, p_logits) if draws is None else draws[:n].to(p_logits.device)
        accept = u < self.accept_probs(v[:n], q, y)
        n_accepted = accept.long().cumprod(0).sum()
        bonus = v[n:] if rows > n else sampling.probs(p_logits[n:])
        emit = torch.cat([self.reject_probs(v[:n], q), bonus])
        return n_accepted, sample(emit[n_accepted], generator)

    def complete(self, p_logits: Tensor, q_logits: Tensor, sampling: Sampling, generator: Generator | None) -> Tensor:
        """The token after a fully accepted round, drawn from ``v`` at one position once the draft has scored it."""
        return sample(self.verifier_probs(p_logits, q_logits, self.transform(sampling)), generator)

    def settle(
        self, p_logits: Tensor, q_logits: Tensor, token: Tensor, sampling: Sampling, generator: Generator | None
    ) -> tuple[Tensor, Tensor]:
        """Check a tentative bonus ``token ~ p`` against ``v = E(q, p)`` (speculative step, proposal ``p``).

        Returns ``(accepted, final_token)``; the final token is distributed as ``v``.
        """
        sampling = self.transform(sampling)
        p = sampling.probs(p_logits)
        v = self.verifier_probs(p_logits, q_logits, sampling)
        accepted = uniform((), generator, p) < _ratio_accept(v, p, token)
        replacement = sample(_positive_part_normalised(v, p), generator)
        return accepted, torch.where(accepted, token, replacement)

    def check_tree(self, tree: DraftTree) -> None:
        """Refuse, in one line, a tree this rule cannot verify exactly."""
        if tree.draw not in self.tree_draws:
            raise ValueError(f"the {self.name} rule verifies trees whose siblings are drawn "
                             f"{' or '.join(self.tree_draws)}, not {tree.draw!r} (a ratio test of deterministic "
                             "siblings is not exact)")

    def sibling_labels(self, p_logits: Tensor, q_logits: Tensor, siblings: Tensor, draw: str,
                       sampling: Sampling | None = None) -> Tensor:
        """Training labels of siblings (DESIGN §11) ``[T, w]``: at each of ``T`` positions, the acceptance of
        sibling ``siblings[:, j]`` given the earlier ones were rejected, the probability ``min(1, r_j(y)/s_j(y))``
        of :meth:`verify_tree`'s test against the residual ``r_j`` left by their rejections, ``s_j`` the distribution
        it was drawn from (``draw``: independently, or without the earlier siblings' tokens). Logits ``[T, V]``."""
        self.check_tree(DraftTree(siblings[0], (ROOT,) * siblings.shape[1], draw))
        sampling = self.transform(sampling or Sampling())
        r = self.verifier_probs(p_logits, q_logits, sampling)
        s = sampling.probs(q_logits)
        labels = []
        for y in siblings.unbind(-1):
            labels.append(self.accept_probs(r, s, y))
            r = self.reject_probs(r, s)
            if draw == "without-replacement":
                s = without(s, y)
        return torch.stack(labels, -1)

    def verify_tree(
        self, tree: DraftTree, p_logits: Tensor, q_logits: Tensor, scored: Tensor, sampling: Sampling,
        generator: Generator | None,
    ) -> tuple[list[int], Tensor]:
        """Verify a draft tree (DESIGN §11); logits ``[N + 1, V]`` by row ``node + 1`` (row 0: the root), ``scored
        [N + 1]``: the rows the draft scored (a leaf's row need not be: its bonus is then tentative, ``~ p``, as a
        chain's after ``K`` candidates).

        From the root, a node's children, in the order drawn, take the ratio test against the residual ``r`` of the
        siblings rejected before them (``r ← norm(max(r − s, 0))``, ``s`` the distribution the rejected sibling was
        drawn from: ``q``, or without replacement ``q`` without the earlier siblings); the first accepted child is
        walked into. Where none is, the token is drawn from the residual; after a leaf, from the bonus distribution.
        Returns ``(path, token)``: the accepted nodes from the root, and the token after them."""
        self.check_tree(tree)
        sampling = self.transform(sampling)
        path, node = [], ROOT
        while True:
            row = node + 1
            children = tree.children(node)
            if not scored[row]:
                if children:
                    raise ValueError(f"tree node {node}: its children were drawn from q, but its row is not scored")
                return path, sample(sampling.probs(p_logits[row]), generator)
            r = self.verifier_probs(p_logits[row], q_logits[row], sampling)
            s = sampling.probs(q_logits[row])
            accepted = None
            for child in children:
                y = tree.tokens[child]
                if uniform((), generator, r) < self.accept_probs(r, s, y):
                    accepted = child
                    break
                r = self.reject_probs(r, s)
                if tree.draw == "without-replacement":
                    s = without(s, y)
            if accepted is None:
                return path, sample(r, generator)
            path.append(accepted)
            node = accepted


@register_rule
@dataclass(eq=False, repr=False)
class Speculative(Rule):
    """Leviathan / Chen speculative sampling: lossless, output ~ ``p``."""

    name = "speculative"
    lossless = True


@register_rule
@dataclass(eq=False, repr=False)
class Greedy(Rule):
    """Draft proposes ``argmax q``; accepted iff it equals ``argmax p``; output equals target greedy.

    :class:`Speculative` under a greedy (temperature 0) transform, whatever the run's sampling
    transform: one-hot ``q`` and ``p`` make the ratio ``1[y = argmax p]``, the residual
    ``onehot(argmax p)`` and the bonus ``argmax p``, so verifying draws nothing: it compares
    argmaxes. The label is ``1[argmax q = argmax p]``.
    """

    name = "greedy"
    lossless = True
    tree_draws = ("independent", "without-replacement", "top-k")

    def transform(self, sampling: Sampling) -> Sampling:
        return Sampling(temperature=0.0)

    def verify(
        self, p_logits: Tensor, q_logits: Tensor, y: Tensor, sampling: Sampling, generator: Generator | None,
        draws: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """:meth:`Rule.verify` with one-hot distributions: accept while ``y`` is the target's argmax; the token is
        the target's argmax after the accepted prefix."""
        n = y.shape[0]
        best = p_logits[: n + 1].argmax(-1)  # [n + 1]
        n_accepted = (y.to(best.device) == best[:n]).long().cumprod(0).sum()
        return n_accepted, best[n_accepted]

    def complete(self, p_logits: Tensor, q_logits: Tensor, sampling: Sampling, generator: Generator | None) -> Tensor:
        """The target's argmax."""
        return p_logits.argmax(-1)

    def settle(
        self, p_logits: Tensor, q_logits: Tensor, token: Tensor, sampling: Sampling, generator: Generator | None
    ) -> tuple[Tensor, Tensor]:
        """A tentative bonus stands iff it is the target's argmax, which replaces it otherwise."""
        best = p_logits.argmax(-1)
        return token == best, best

    def sibling_labels(self, p_logits: Tensor, q_logits: Tensor, siblings: Tensor, draw: str,
                       sampling: Sampling | None = None) -> Tensor:
        """``1[y = argmax p]`` for every sibling ``[T, w]``: an earlier sibling's rejection changes nothing."""
        return (siblings == p_logits.argmax(-1, keepdim=True)).float()

    def verify_tree(
        self, tree: DraftTree, p_logits: Tensor, q_logits: Tensor, scored: Tensor, sampling: Sampling,
        generator: Generator | None,
    ) -> tuple[list[int], Tensor]:
        """Walk from the root into the child equal to the target's argmax (the first, where siblings repeat it),
        while there is one; the token is the target's argmax after the path: the target's greedy output."""
        path, node = [], ROOT
        while True:
            best = p_logits[node + 1].argmax(-1)
            child = next((c for c in tree.children(node) if tree.tokens[c] == best), None)
            if child is None:
                return path, best
            path.append(child)
            node = child

    def label(
        self, p_logits: Tensor, q_logits: Tensor, y: Tensor, sampling: Sampling | None = None, *,
        shared: SharedScores | None = None,
    ) -> Tensor:
        """``1[argmax q = argmax p]`` (no probabilities needed)."""
        p_argmax, q_argmax = (p_logits.argmax(-1), q_logits.argmax(-1)) if shared is None else shared.argmax()
        return (p_argmax == q_argmax).float()


@register_rule
@dataclass(eq=False, repr=False)
class Fuzzy(Rule):
    """FSD: accept while ``Div(p, q) < threshold``; emit a sample of the full ``p`` at rejection."""

    divergence: str = "js"
    threshold: float = 0.3
    name: ClassVar[str] = "fuzzy"
    lossless: ClassVar[bool] = False
    swept: ClassVar[str | None] = "threshold"

    def __post_init__(self) -> None:
        if self.divergence not in DIVERGENCES:
            raise ValueError(f"unknown divergence {self.divergence!r}; valid: {', '.join(DIVERGENCES)}")
        if self.threshold < 0:
            raise ValueError(f"threshold must be >= 0, got {self.threshold}")
        self.threshold = float(self.threshold)

    def labelled(self) -> tuple[Rule, ...]:
        """None: the labels are read off the stored divergence column (:meth:`labels_from`)."""
        return ()

    @property
    def label_column(self) -> str:
        """The stored divergence column: ``1[Div < T]`` is applied at training time, so any T can be chosen later."""
        return self.divergence

    def labels_from(self, column: Tensor) -> Tensor:
        """``1[Div < T]`` on the stored divergences."""
        return (column < self.threshold).float()

    def accept_probs(self, v: Tensor, q: Tensor, y: Tensor) -> Tensor:
        return (DIVERGENCES[self.divergence](v, q) < self.threshold).float()

    def expected_accept_probs(self, v: Tensor, q: Tensor) -> Tensor:
        """Fuzzy acceptance does not depend on the candidate: ``1[Div(v, q) < threshold]``."""
        return self.accept_probs(v, q, q.argmax(-1))

    def reject_probs(self, v: Tensor, q: Tensor) -> Tensor:
        return v

    def check_tree(self, tree: DraftTree) -> None:
        """FSD takes no tree: its verdict at a position depends on the position's two distributions, not on the
        candidate, so a sibling cannot change it."""
        raise ValueError("the fuzzy rule decides each position by its two distributions, not by the candidate, so "
                         "siblings cannot change its verdict: decode it with a chain policy")


@register_rule
@dataclass(eq=False, repr=False)
class Ensemble(Rule):
    """Speculative Ensemble: lossless w.r.t. ``r = E(q, p)``.

    ``kind="weighted"``: ``r = λ q + (1−λ) p`` on transformed distributions (``weight`` λ);
    ``kind="contrastive"``: ``r = transform(l_p − μ l_q)`` on raw logits (``mu`` μ). The other kind's parameter
    is kept for the label column collection stores of that kind (:meth:`labelled`) and is no part of the rule's
    :meth:`spec`. Under a greedy transform ``r`` is the one-hot argmax of the untempered ensemble (never the
    argmax of one member). ``r`` is :meth:`function`'s :class:`~decode.ensemble_fn.EnsembleFn` over ``[q, p]``,
    with its defaults ``λ = DEFAULT_WEIGHT``, ``μ = DEFAULT_MU``. The bonus after K accepted candidates is a
    tentative ``b ~ p`` that the draft checks against ``r`` in its next forward (the alternate proposal of
    DESIGN §4 with ``γ_p = 1``).
    """

    kind: str = "weighted"
    weight: float = DEFAULT_WEIGHT
    mu: float = DEFAULT_MU
    name: ClassVar[str] = "ensemble"
    lossless: ClassVar[bool] = True
    tentative_bonus: ClassVar[bool] = True
    KINDS: ClassVar[tuple[str, ...]] = ("weighted", "contrastive")

    def __post_init__(self) -> None:
        if self.kind not in self.KINDS:
            raise ValueError(f"unknown ensemble kind {self.kind!r}; valid: {', '.join(self.KINDS)}")
        self.weight, self.mu = float(self.weight), float(self.mu)
        if not 0.0 <= self.weight <= 1.0:
            raise ValueError(f"ensemble weight λ must be in [0, 1], got {self.weight}")

    @property
    def primary(self) -> str:
        """λ (``weight``) for the weighted kind, μ (``mu``) for the contrastive one."""
        return "weight" if self.kind == "weighted" else "mu"

    def labelled(self) -> tuple[Rule, ...]:
        """Both kinds, each with its own parameter."""
        return tuple(replace(self, kind=kind) for kind in self.KINDS)

    @property
    def label_column(self) -> str:
        return f"label_ensemble_{self.kind}"

    def params(self) -> dict[str, JSON]:
        return {"kind": self.kind, self.primary: getattr(self, self.primary)}

    def function(self) -> EnsembleFn:
        """The two-model ensemble function of this rule for models ``[q, p]`` (proposer ``q`` first)."""
        if self.kind == "weighted":
            return EnsembleFn("weighted", weights=(self.weight, 1.0 - self.weight))
        return EnsembleFn("contrastive", mu=self.mu, expert=1)

    @classmethod
    def from_function(cls, fn: EnsembleFn, n: int) -> Ensemble | None:
        """The rule equivalent to ``fn`` over ``n`` models ``[q, p]``, or ``None`` when there is none."""
        coef = fn.coefficients(n)
        if n != 2:
            return None
        if fn.kind == "weighted":
            return cls("weighted", weight=coef[0])
        return cls("contrastive", mu=-coef[0]) if fn.expert % 2 == 1 else None

    def verifier_probs(
        self, p_logits: Tensor, q_logits: Tensor, sampling: Sampling, p: Tensor | None = None
    ) -> Tensor:
        """``r`` from :meth:`function` over both members' raw logits (a precomputed ``p`` is not used)."""
        return self.function().probs(torch.stack([q_logits.float(), p_logits.float()]), sampling)


def from_spec(name: str, **params: Any) -> Rule:
    """Build a rule from its :attr:`~Rule.name` and any of its parameters (:meth:`~Rule.params`, as stored in
    metadata; the others keep their defaults)."""
    try:
        cls = RULES[name]
    except KeyError:
        raise ValueError(f"unknown rule {name!r}; valid rules: {', '.join(RULES)}") from None
    unknown = sorted(set(params) - set(cls.defaults()))
    if unknown:
        raise ValueError(f"rule {name!r} has no parameter {', '.join(unknown)}; "
                         f"its parameters: {', '.join(cls.defaults()) or 'none'}")
    return cls(**params)
