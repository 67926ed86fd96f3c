"""Every round a decoder could start along labelled responses, its candidates flattened with what a head could read
before the round is verified (docs/design.md §10, "The structure of acceptance").

A round starting at response position ``s`` proposes candidates at positions ``s, s + 1, …``; its candidate at depth
``d`` carries the rule's label at position ``s + d − 1`` and depth ``d`` (a feature draft's labels per depth; any
other draft's ``q`` has no depth, so its depth-1 column serves every depth). Each candidate's verdict is a seeded
coin of its label, and a candidate is reached when every earlier candidate of its round was accepted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

import torch
from torch import Tensor

from data_gen.labels import depth_column, stored_depths

#: The draft's top probability under the run's transform, stored per depth like the labels.
TOP_PROB = "draft_top_prob"
#: The entropy of the target's distribution at each position (depth 1 only: it reads the target alone).
TARGET_ENTROPY = "target_entropy"


@dataclass(frozen=True)
class RoundCandidates:
    """The candidates of every round started at each position of every response, flattened: ``[N]`` each."""

    response: Tensor  # [N] long: which response (the bootstrap's unit)
    depth: Tensor  # [N] long: 1..D, the candidate's depth in its round
    position: Tensor  # [N] long: the candidate's position in its response
    label: Tensor  # [N] float64: the rule's acceptance probability
    reach_prob: Tensor  # [N] float64: the product of the round's earlier labels (the chance it is reached)
    reached: Tensor  # [N] bool: every earlier coin of the round came up accepted
    verdict: Tensor  # [N] bool: this candidate's coin (meaningful where reached)
    top_prob: Tensor  # [N] float64: the draft's top probability at the candidate
    round_so_far: Tensor  # [N] float64: the product of the round's earlier top probabilities (1 at depth 1)
    running_acceptance: Tensor  # [N] float64: mean depth-1 label of the response before the round (NaN at its start)
    target_entropy: Tensor  # [N] float64: the target's entropy at the token before the round (NaN at its start)
    responses: int  # the responses they come from (some may hold no candidate)

    def where(self, keep: Tensor) -> RoundCandidates:
        """The candidates where ``keep[N]`` holds (of the same responses)."""
        return RoundCandidates(**{f.name: getattr(self, f.name)[keep] for f in fields(self) if f.name != "responses"},
                               responses=self.responses)


def _by_depth(row: dict, name: str, depths: int) -> Tensor:
    """``[T, D]``: column ``name`` at depth ``d`` of the round starting at each position ``s`` (NaN past the end).

    With one stored depth the depth-1 column is read at ``s + d − 1`` for every ``d``.
    """
    stored = stored_depths(list(row), name)
    first = torch.tensor(row[name], dtype=torch.float64)
    table = torch.full((len(first), depths), float("nan"), dtype=torch.float64)
    for depth in range(1, depths + 1):
        column = torch.tensor(row[depth_column(name, depth)], dtype=torch.float64) if stored > 1 else first
        table[: len(first) - depth + 1, depth - 1] = column[depth - 1 :]
    return table


def response_rounds(row: dict, label_column: str, depths: int, generator: torch.Generator,
                    labels_from: Callable[[Tensor], Tensor]) -> dict[str, Tensor]:
    """One response's rounds as ``[T, D]`` tables (row ``s``: the round starting at position ``s``)."""
    stored = _by_depth(row, label_column, depths)
    labels = torch.where(stored.isnan(), stored, labels_from(stored).double())
    top = _by_depth(row, TOP_PROB, depths)
    length = labels.shape[0]
    coins = torch.rand(labels.shape, generator=generator, dtype=torch.float64) < labels.nan_to_num(0.0)
    ones = torch.ones(length, 1, dtype=torch.float64)
    earlier = torch.cat([ones, labels.nan_to_num(0.0).cumprod(1)[:, :-1]], 1)
    reached = torch.cat([torch.ones(length, 1, dtype=torch.bool), coins.cumprod(1)[:, :-1].bool()], 1)
    first = labels[:, 0]
    before = torch.cat([torch.zeros(1, dtype=torch.float64), first.cumsum(0)[:-1]])
    steps = torch.arange(length, dtype=torch.float64)
    running = torch.where(steps > 0, before / steps.clamp_min(1), torch.full_like(steps, float("nan")))
    entropy = torch.tensor(row[TARGET_ENTROPY], dtype=torch.float64)
    last_entropy = torch.cat([torch.full((1,), float("nan"), dtype=torch.float64), entropy[:-1]])
    depth = torch.arange(1, depths + 1).expand(length, depths)
    return {
        "depth": depth,
        "position": torch.arange(length)[:, None] + depth - 1,
        "label": labels,
        "reach_prob": earlier,
        "reached": reached,
        "verdict": coins,
        "top_prob": top,
        "round_so_far": torch.cat([ones, top.nan_to_num(0.0).cumprod(1)[:, :-1]], 1),
        "running_acceptance": running[:, None].expand(length, depths),
        "target_entropy": last_entropy[:, None].expand(length, depths),
    }


def round_candidates(rows: list[dict], label_column: str, depths: int, seed: int,
                     labels_from: Callable[[Tensor], Tensor] = lambda column: column) -> RoundCandidates:
    """The candidates of every round of ``depths`` along ``rows`` (labelled responses, as collection writes them).

    ``label_column``: the rule's stored column, ``labels_from`` its labels (:meth:`decode.rules.Rule.labels_from`,
    e.g. fuzzy's threshold on a stored divergence); the coins are drawn from one generator seeded with ``seed``,
    response by response in order. A feature draft's rows hold labels per depth (``depths`` at most their stored
    depth).
    """
    stored = stored_depths(list(rows[0]), label_column) if rows else 1
    if 1 < stored < depths:
        raise ValueError(f"the responses hold {stored} depths of {label_column!r}; rounds of {depths} need more "
                         "(collect with collect.depths >= the rounds' depth)")
    generator = torch.Generator().manual_seed(seed)
    parts: dict[str, list[Tensor]] = {f.name: [] for f in fields(RoundCandidates) if f.name != "responses"}
    for index, row in enumerate(rows):
        if not row[label_column]:
            continue
        tables = response_rounds(row, label_column, depths, generator, labels_from)
        keep = ~tables["label"].isnan()
        for name, table in tables.items():
            parts[name].append(table[keep])
        parts["response"].append(torch.full((int(keep.sum()),), index, dtype=torch.long))
    return RoundCandidates(**{name: torch.cat(values) if values else torch.empty(0) for name, values in parts.items()},
                           responses=len(rows))
