"""A round's draft tree (DESIGN §11): the tokens a draft proposes as a tree of candidates, and how a node's children
were drawn, which decides how a rule may verify them exactly (:meth:`decode.rules.Rule.verify_tree`).

Node ``i`` holds ``tokens[i]`` and is a child of ``parents[i]`` (``-1``: the root, the position after the last
emitted token; a parent comes before its children). Rows of the per-node distributions a verifier reads are
``node + 1``: row 0 is the root's, row ``i + 1`` the distribution after node ``i``'s path. A node's children were
drawn in index order from the draft's ``q`` at it:

* ``independent``: each from ``q`` (siblings may repeat a token; SpecInfer's multi-step speculative sampling);
* ``without-replacement``: each from ``q`` without the earlier siblings' tokens (Gumbel top-k; recursive rejection
  sampling, Jeon et al. 2024);
* ``top-k``: the ``k`` most likely tokens, no draw at all (exact only for the greedy rule, whose verdict compares
  argmaxes).

A chain is the tree of width 1 (:meth:`DraftTree.chain`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Generator, Tensor

SIBLING_DRAWS = ("independent", "without-replacement", "top-k")
ROOT = -1


@dataclass(frozen=True)
class DraftTree:
    """The draft's candidates of one round as a tree; ``draw``: how each node's children were drawn."""

    tokens: Tensor  # [N] long: node i's token
    parents: tuple[int, ...]  # [N]: node i's parent (ROOT or an earlier node)
    draw: str = "independent"

    def __post_init__(self) -> None:
        if self.draw not in SIBLING_DRAWS:
            raise ValueError(f"unknown sibling draw {self.draw!r}; valid: {', '.join(SIBLING_DRAWS)}")
        if self.tokens.dim() != 1 or len(self.parents) != self.tokens.shape[0]:
            raise ValueError(f"a draft tree needs one parent per token: {len(self.parents)} parents for tokens of "
                             f"shape {tuple(self.tokens.shape)}")
        if any(not ROOT <= parent < node for node, parent in enumerate(self.parents)):
            raise ValueError(f"every node's parent must be the root ({ROOT}) or an earlier node, got {self.parents}")

    @classmethod
    def chain(cls, tokens: Tensor, draw: str = "independent") -> DraftTree:
        """The tree of width 1: each candidate the child of the one before."""
        return cls(tokens, tuple(range(-1, tokens.shape[0] - 1)), draw)

    @property
    def size(self) -> int:
        """Its number of nodes (the candidates a target forward verifies)."""
        return len(self.parents)

    def children(self, node: int) -> list[int]:
        """``node``'s children (ROOT: the first depth) in the order they were drawn."""
        return [child for child, parent in enumerate(self.parents) if parent == node]

    def depth(self, node: int) -> int:
        """Its depth: 1 for the root's children."""
        depth = 0
        while node != ROOT:
            node, depth = self.parents[node], depth + 1
        return depth

    def attention(self) -> Tensor:
        """``[N, N]`` bool: node ``i`` attends to node ``j`` iff ``j`` is ``i`` or one of its ancestors (the tree
        attention mask's columns of the round's nodes; every node also sees the whole prefix before the root)."""
        mask = torch.eye(self.size, dtype=torch.bool, device=self.tokens.device)
        for node, parent in enumerate(self.parents):
            if parent != ROOT:
                mask[node] |= mask[parent]
        return mask

    def positions(self, start: int) -> Tensor:
        """``[N]`` position ids: a node at depth ``d`` sits at ``start + d − 1`` (``start``: the first new position)."""
        return torch.tensor([start + self.depth(node) - 1 for node in range(self.size)], dtype=torch.long,
                            device=self.tokens.device)

    def path_tokens(self, path: list[int]) -> Tensor:
        """The tokens ``[len(path)]`` of a root-to-node path of nodes."""
        return self.tokens[torch.tensor(path, dtype=torch.long, device=self.tokens.device)]


def draw_siblings(q: Tensor, k: int, draw: str, generator: Generator | None) -> Tensor:
    """``k`` children ``[k]`` of a node whose draft distribution is ``q [V]``, drawn as ``draw`` says (top-k: the
    ``k`` most likely, ties by index), on the generator's device (:func:`decode.rules.sample`'s convention)."""
    if draw not in SIBLING_DRAWS:
        raise ValueError(f"unknown sibling draw {draw!r}; valid: {', '.join(SIBLING_DRAWS)}")
    if draw == "top-k":
        return q.topk(k).indices
    device = q.device if generator is None else generator.device
    drawn = torch.multinomial(q.to(device), k, replacement=draw == "independent", generator=generator)
    return drawn.to(q.device)


def without(q: Tensor, token: Tensor) -> Tensor:
    """``q [..., V]`` with ``token [...]`` removed from each row and renormalised: the distribution the next sibling
    drawn without replacement comes from."""
    rest = q.scatter(-1, token[..., None], 0.0)
    return rest / rest.sum(-1, keepdim=True).clamp_min(1e-30)
