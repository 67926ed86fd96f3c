"""Information measures of acceptance, in bits (DESIGN §3): the SV profile's gain ``I(A; X, Y)`` and the structure
table's conditional gain ``I(A; Z | X)``, each shuffle-corrected for the plug-in estimate's upward bias."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from decode.metadata import InformationGain


def entropy_bits(counts: Tensor) -> Tensor:
    """Shannon entropy (bits) of the distribution proportional to ``counts`` along the last dim."""
    probs = counts.double() / counts.double().sum(-1, keepdim=True).clamp_min(1e-300)
    return -(torch.xlogy(probs, probs).sum(-1)) / torch.log(torch.tensor(2.0, dtype=torch.float64))


#: Shuffles of the acceptance bins behind the null term of :func:`information_gain`'s correction.
NULL_SHUFFLES = 20


def plug_in_gain(joint: Tensor) -> tuple[float, float]:
    """``(H(A), H(A) - H(A | X, Y))`` in bits, plug-in estimates from a count table ``[..., A-bins]``."""
    cells = joint.double().reshape(-1, joint.shape[-1])
    h_a = float(entropy_bits(cells.sum(0)))
    weights = cells.sum(-1) / cells.sum().clamp_min(1e-300)
    return h_a, h_a - float((weights * entropy_bits(cells)).sum())


def null_gain(joint: Tensor, shuffles: int = NULL_SHUFFLES, seed: int = 0) -> float:
    """The mean plug-in gain of tables with ``joint``'s margins and no dependence: its positions' acceptance bins
    shuffled across the conditioning cells (``shuffles`` times, seeded)."""
    cells = joint.reshape(-1, joint.shape[-1]).round().long()
    cell_of = torch.repeat_interleave(torch.arange(cells.shape[0]), cells.sum(-1))
    bin_of = torch.repeat_interleave(torch.arange(cells.shape[1]).repeat(cells.shape[0]), cells.reshape(-1))
    generator = torch.Generator().manual_seed(seed)
    gains = []
    for _ in range(shuffles):
        shuffled = bin_of[torch.randperm(len(bin_of), generator=generator)]
        table = torch.zeros(cells.shape, dtype=torch.float64)
        table.index_put_((cell_of, shuffled), torch.ones(len(shuffled), dtype=torch.float64), accumulate=True)
        gains.append(plug_in_gain(table)[1])
    return sum(gains) / len(gains)


def information_gain(joint: Tensor) -> InformationGain:
    """``H(A)``, ``H(A | X, Y)`` (bits) and the gain ``I(A; X, Y)`` from a count table ``[..., A-bins]``.

    All leading dimensions together form the conditioning variable (e.g. ``[x-bin, y-bin]``). The
    plug-in gain is biased upward by about ``(A-bins − 1)(cells − 1) / (2 N ln 2)`` bits, even with no
    dependence at all (DESIGN §3); ``gain`` subtracts the mean
    plug-in gain of the same table with its acceptance bins shuffled (:func:`null_gain`, the
    "shuffle-corrected" estimate: unbiased without dependence, conservative with it) and
    ``h_a_given_xy`` is ``h_a − gain``. ``gain_plugin`` keeps the uncorrected estimate (the SV paper's).
    """
    h_a, plug_in = plug_in_gain(joint)
    gain = plug_in - null_gain(joint)
    return InformationGain(h_a=h_a, h_a_given_xy=h_a - gain, gain=gain, gain_fraction=gain / h_a if h_a > 0 else 0.0,
                           gain_plugin=plug_in)


@dataclass(frozen=True)
class ConditionalGain:
    """What a variable ``Z`` tells about acceptance ``A`` beyond a variable ``X``, in bits."""

    h_a_given_x: float  # H(A | X), plug-in
    gain: float  # I(A; Z | X), shuffle-corrected
    gain_plugin: float  # the uncorrected plug-in estimate (biased upward)

    @property
    def fraction(self) -> float:
        """The gain as a share of what ``X`` leaves unexplained, ``H(A | X)``."""
        return self.gain / self.h_a_given_x if self.h_a_given_x > 0 else 0.0


def conditional_gain(joint: Tensor, shuffles: int = NULL_SHUFFLES, seed: int = 0) -> ConditionalGain:
    """``I(A; Z | X)`` from a count table ``[X-bins, Z-bins..., A-bins]`` (all middle dimensions form ``Z``).

    Each ``X`` slice's plug-in gain ``I(A; Z | X = x)``, weighted by the slice's share of the counts; the
    correction subtracts the same sum with ``A`` shuffled within each slice (:func:`null_gain`), the null of no
    dependence on ``Z`` once ``X`` is known.
    """
    slices = joint.double().reshape(joint.shape[0], -1, joint.shape[-1])
    weights = slices.sum((1, 2)) / slices.sum().clamp_min(1e-300)
    h_given_x = plugin = null = 0.0
    for index, (weight, table) in enumerate(zip(weights.tolist(), slices)):
        if weight == 0:
            continue
        h_a, gain = plug_in_gain(table)
        h_given_x += weight * h_a
        plugin += weight * gain
        null += weight * null_gain(table, shuffles, seed + index)
    return ConditionalGain(h_a_given_x=h_given_x, gain=plugin - null, gain_plugin=plugin)
