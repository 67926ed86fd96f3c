"""The structure of acceptance over round candidates (docs/design.md §10): acceptance by depth, conditional on the
round so far and unconditional, and what each variable a head could read adds beyond the draft's top probability.

The acceptance rates' intervals are 95 % bootstrap intervals over responses (prompts). The gains are shuffle-corrected
(:func:`accept_heads.measure.information.conditional_gain`), with a seeded coin as the negative control, and their
intervals are half-sample intervals: a bootstrap draw repeats responses, which the shuffle correction cannot see (it
would shift every draw's gain upward), so each draw takes half the responses without replacement, and the spread of
the half-samples' gains (whose variance matches the full sample's for a mean) is centred on the full sample's gain.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from accept_heads.measure.bootstrap import interval, paired_draws
from accept_heads.measure.information import conditional_gain, information_gain
from accept_heads.structure.rounds import RoundCandidates

#: Quantile bins of the draft's top probability that every gain is conditioned on.
TOP_PROB_BINS = 8
#: Quantile bins of each continuous variable.
VARIABLE_BINS = 4
#: Edges of the position bins (tokens into the response).
POSITION_EDGES = (8, 16, 32, 64)
#: Bootstrap draws of a gain's interval (each reruns the shuffle correction, with :data:`DRAW_SHUFFLES` shuffles).
GAIN_DRAWS = 200
DRAW_SHUFFLES = 5


@dataclass(frozen=True)
class DepthAcceptance:
    """Acceptance at one depth of the round, over every round started along the responses."""

    depth: int
    unconditional: float  # E[a_1 ⋯ a_d]: the round reaches depth d and accepts it
    conditional: float  # E[a_1 ⋯ a_d] / E[a_1 ⋯ a_(d−1)]: accepted, given the earlier depths were
    low: float  # 95 % bootstrap interval of ``conditional`` over responses
    high: float


@dataclass(frozen=True)
class VariableGain:
    """What one variable ``Z`` tells about a reached candidate's verdict beyond the draft's top probability ``X``."""

    variable: str
    gain: float  # I(A; Z | X) in bits, shuffle-corrected
    low: float  # 95 % half-sample interval over responses (module docstring)
    high: float
    fraction: float  # gain / H(A | X)
    bins: tuple[str, ...]  # each Z bin's label
    acceptance: tuple[float, ...]  # the share accepted in each Z bin
    candidates: int  # reached candidates the gain is measured on


@dataclass(frozen=True)
class Structure:
    """One rule's structure on one prompt set."""

    rule: str
    set: str
    responses: int
    candidates: int  # reached candidates (the gains' population)
    h_a: float  # H(A) of their verdicts, bits
    top_prob_gain: float  # I(A; X), shuffle-corrected: what the draft's top probability alone tells
    depths: tuple[DepthAcceptance, ...]
    gains: tuple[VariableGain, ...]


def quantile_bins(values: Tensor, bins: int) -> tuple[Tensor, tuple[str, ...]]:
    """Each value's quantile bin (ties kept together, so there may be fewer bins) and each bin's label."""
    edges = torch.unique(torch.quantile(values, torch.linspace(0, 1, bins + 1, dtype=values.dtype)[1:-1]))
    index = torch.bucketize(values, edges, right=True)
    bounds = [float(values.min()), *edges.tolist(), float(values.max())]
    return index, tuple(f"{low:.2g}–{high:.2g}" for low, high in itertools.pairwise(bounds))


def edge_bins(values: Tensor, edges: tuple[int, ...]) -> tuple[Tensor, tuple[str, ...]]:
    """Each value's bin between fixed integer ``edges`` (positions counted from 1 in the labels)."""
    bounds = [0, *edges]
    labels = [f"{low + 1}–{high}" for low, high in itertools.pairwise(bounds)] + [f"> {edges[-1]}"]
    return torch.bucketize(values, torch.tensor(edges), right=True), tuple(labels)


#: A variable a head could read: the candidates it is defined on, and their bins.
Binning = Callable[[RoundCandidates], tuple[Tensor, Tensor, tuple[str, ...]]]


def _quantiles_of(name: str, min_depth: int = 1) -> Binning:
    def bins(c: RoundCandidates) -> tuple[Tensor, Tensor, tuple[str, ...]]:
        values = getattr(c, name)
        keep = values.isfinite() & (c.depth >= min_depth)
        if not keep.any():
            return keep, c.depth[keep], ()
        return (keep, *quantile_bins(values[keep], VARIABLE_BINS))
    return bins


def _depth(c: RoundCandidates) -> tuple[Tensor, Tensor, tuple[str, ...]]:
    depths = int(c.depth.max())
    return torch.ones_like(c.reached), c.depth - 1, tuple(str(d) for d in range(1, depths + 1))


def _position(c: RoundCandidates) -> tuple[Tensor, Tensor, tuple[str, ...]]:
    return (torch.ones_like(c.reached), *edge_bins(c.position, POSITION_EDGES))


def _coin(c: RoundCandidates) -> tuple[Tensor, Tensor, tuple[str, ...]]:
    generator = torch.Generator().manual_seed(len(c.depth))
    return torch.ones_like(c.reached), torch.randint(0, VARIABLE_BINS, c.depth.shape, generator=generator), tuple(
        f"coin {b + 1}" for b in range(VARIABLE_BINS))


#: The variables of the table, in its order; the last is the negative control (a coin unrelated to anything).
VARIABLES: dict[str, Binning] = {
    "depth in the round": _depth,
    "the round so far (its earlier top probabilities' product)": _quantiles_of("round_so_far", min_depth=2),
    "the request so far (its running acceptance)": _quantiles_of("running_acceptance"),
    "position in the response": _position,
    "the target's entropy before the round": _quantiles_of("target_entropy"),
    "control: a seeded coin": _coin,
}


def depth_acceptance(c: RoundCandidates, seed: int) -> tuple[DepthAcceptance, ...]:
    """Unconditional and conditional acceptance at every depth, with the conditional's bootstrap interval."""
    responses, draws = c.responses, paired_draws(c.responses, seed, GAIN_DRAWS)
    weights = np.stack([np.bincount(row, minlength=responses) for row in draws])  # [draws, responses]
    rows = []
    for depth in range(1, int(c.depth.max()) + 1):
        at = c.depth == depth
        reach, label, response = c.reach_prob[at].numpy(), c.label[at].numpy(), c.response[at].numpy()
        accepted = np.bincount(response, reach * label, minlength=responses)
        reached = np.bincount(response, reach, minlength=responses)
        drawn = np.divide(weights @ accepted, weights @ reached, out=np.full(len(weights), np.nan),
                          where=(weights @ reached) > 0)
        low, high = interval(drawn)
        conditional = float(accepted.sum() / reached.sum()) if reached.sum() > 0 else float("nan")
        rows.append(DepthAcceptance(depth, float((reach * label).mean()), conditional, low, high))
    return tuple(rows)


def _count_tables(c: RoundCandidates, x: Tensor, z: Tensor, x_bins: int, z_bins: int, responses: int) -> np.ndarray:
    """``[responses, X-bins, Z-bins, 2]`` counts of verdicts per response."""
    cell = ((c.response * x_bins + x) * z_bins + z) * 2 + c.verdict.long()
    return np.bincount(cell.numpy(), minlength=responses * x_bins * z_bins * 2).reshape(
        responses, x_bins, z_bins, 2)


def half_samples(responses: int, seed: int, draws: int) -> np.ndarray:
    """``[draws, responses // 2]`` response indices, each row half the responses drawn without replacement."""
    generator = np.random.default_rng(seed)
    return np.stack([generator.permutation(responses)[: max(1, responses // 2)] for _ in range(draws)])


def variable_gain(c: RoundCandidates, name: str, x: Tensor, x_bins: int, seed: int) -> VariableGain:
    """``I(A; Z | X)`` of variable ``name`` (:data:`VARIABLES`) over the reached candidates ``c`` with top-probability
    bins ``x``, its half-sample interval, and the share accepted in each of its bins."""
    keep, z, labels = VARIABLES[name](c)
    if not keep.any():  # e.g. no round of these responses reached depth 2
        nan = float("nan")
        return VariableGain(name, nan, nan, nan, nan, (), (), 0)
    kept = c.where(keep)
    tables = _count_tables(kept, x[keep], z, x_bins, len(labels), c.responses)
    total = conditional_gain(torch.from_numpy(tables.sum(0)))
    drawn = np.asarray([conditional_gain(torch.from_numpy(tables[half].sum(0)), shuffles=DRAW_SHUFFLES, seed=seed).gain
                        for half in half_samples(c.responses, seed, GAIN_DRAWS)])
    low, high = interval(total.gain + drawn - drawn.mean())
    by_bin = tables.sum((0, 1))
    acceptance = tuple(float(b[1] / b.sum()) if b.sum() else float("nan") for b in by_bin)
    return VariableGain(name, total.gain, low, high, total.fraction, labels, acceptance, int(keep.sum()))


def structure(c: RoundCandidates, rule: str, set_name: str, seed: int) -> Structure:
    """The structure table's rows for one rule's candidates on one prompt set."""
    reached = c.where(c.reached)
    x, _ = quantile_bins(reached.top_prob, TOP_PROB_BINS)
    x_bins = int(x.max()) + 1
    joint = torch.zeros(x_bins, 2, dtype=torch.float64).index_put_(
        (x, reached.verdict.long()), torch.ones(len(x), dtype=torch.float64), accumulate=True)
    alone = information_gain(joint)
    gains = tuple(variable_gain(reached, name, x, x_bins, seed) for name in VARIABLES)
    return Structure(rule, set_name, c.responses, len(reached.depth), alone.h_a, alone.gain,
                     depth_acceptance(c, seed), gains)
