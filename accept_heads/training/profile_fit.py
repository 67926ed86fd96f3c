"""Speculative Verification profile (DESIGN §3): binning fit, information gain, latency profile.

* Bins: equal-frequency edges of the companion indicators ``X`` and ``Y`` on the train split —
  those of the head's rule (columns ``sv_x_<rule>``, ``sv_y_<rule>``; see :mod:`accept_heads.training.training_data`).
  Repeated quantiles (e.g. the mass of ``Y = 1``) are merged, so a profile can hold fewer bins
  than requested; the point mass then gets a bin of its own.
* Table: per (X-bin, Y-bin) mean train acceptance under the head's rule, with counts; bins with
  fewer than ``min_bin_count`` positions back off to their X-row's mean (and an empty row to the
  global mean).
* Information gain on dev: ``H(A) − H(A | X, Y)`` with ``A`` cut into ``a_bins`` equal-width bins
  of ``[0, 1]`` and the train-fitted (X, Y) bins; plug-in estimates in bits.
* Latency: target verification time for ``L = 1..k_max`` candidates (a forward over ``L + 1``
  tokens on top of the KV cache of a typical dev prompt), median of ``repeats`` runs.

The counting runs as a Lightning validation loop (:class:`ProfileFitter`), so it uses the
configured devices and strategy; counts are summed across ranks by torchmetrics.
"""

from __future__ import annotations

import lightning as L
import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics import Metric
from transformers import PreTrainedModel

from accept_heads.training.training_data import PositionTable
from decode.batch_costs import forward_table
from decode.profile import SVProfile


def equal_frequency_edges(values: np.ndarray, bins: int) -> Tensor:
    """``[n + 1]`` edges (``n ≤ bins``) holding about equally many ``values`` per bin; outer edges span ``[0, 1]``."""
    interior = np.unique(np.quantile(values, np.linspace(0, 1, bins + 1)[1:-1]))
    low, high = min(0.0, float(values.min())), max(1.0, float(values.max()))
    interior = interior[(interior > low) & (interior <= high)]
    return torch.tensor(np.concatenate([[low], interior, [high]]), dtype=torch.float64)


def bin_index(values: Tensor, edges: Tensor) -> Tensor:
    """Bin of each value, exactly as :meth:`decode.profile.SVProfile.alpha` assigns it."""
    return torch.bucketize(values.float(), edges[1:-1].float().to(values.device), right=True)


class BinnedAcceptance(Metric):
    """Per (X-bin, Y-bin): acceptance sum and count, and a joint count with ``a_bins`` A-bins."""

    full_state_update = False

    def __init__(self, x_edges: Tensor, y_edges: Tensor, a_bins: int) -> None:
        super().__init__()
        self.x_edges, self.y_edges, self.a_bins = x_edges, y_edges, a_bins
        nx, ny = x_edges.numel() - 1, y_edges.numel() - 1
        self.add_state("sums", default=torch.zeros(nx, ny, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("counts", default=torch.zeros(nx, ny, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("joint", default=torch.zeros(nx, ny, a_bins, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, x: Tensor, y: Tensor, a: Tensor) -> None:
        nx, ny = self.counts.shape
        cell = bin_index(x, self.x_edges) * ny + bin_index(y, self.y_edges)
        a_bin = (a * self.a_bins).long().clamp(0, self.a_bins - 1)
        self.sums += torch.bincount(cell, a.double(), nx * ny).view(nx, ny)
        self.counts += torch.bincount(cell, minlength=nx * ny).view(nx, ny).double()
        self.joint += torch.bincount(cell * self.a_bins + a_bin, minlength=nx * ny * self.a_bins).view(
            nx, ny, self.a_bins
        ).double()

    def compute(self) -> dict[str, Tensor]:
        return {"sums": self.sums, "counts": self.counts, "joint": self.joint}


class ProfileFitter(L.LightningModule):
    """No parameters: the validation loop accumulates train (dataloader 0) and dev (1) bin counts."""

    def __init__(self, x_edges: Tensor, y_edges: Tensor, a_bins: int) -> None:
        super().__init__()
        self.train_bins = BinnedAcceptance(x_edges, y_edges, a_bins)
        self.dev_bins = BinnedAcceptance(x_edges, y_edges, a_bins)

    def validation_step(self, batch: list[Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        x, y, a = batch
        (self.train_bins if dataloader_idx == 0 else self.dev_bins).update(x, y, a)


def position_loader(table: PositionTable, batch_size: int = 65536) -> DataLoader:
    """``(X, Y, a)`` triples of every position of a split (the table's rule's indicators and labels)."""
    if table.companion is None:
        raise ValueError("an SV profile needs the rule's companion indicators (load_positions with_companion=True)")
    tensors = [torch.from_numpy(table.companion[:, 0]), torch.from_numpy(table.companion[:, 1]),
               torch.from_numpy(table.label)]
    return DataLoader(TensorDataset(*tensors), batch_size=batch_size)


def backed_off_table(sums: Tensor, counts: Tensor, min_count: int) -> Tensor:
    """Mean acceptance per bin; bins under ``min_count`` take their row's mean (empty rows: the global mean)."""
    global_mean = sums.sum() / counts.sum().clamp_min(1)
    row_counts = counts.sum(1, keepdim=True)
    row_mean = torch.where(row_counts > 0, sums.sum(1, keepdim=True) / row_counts.clamp_min(1), global_mean)
    cell_mean = sums / counts.clamp_min(1)
    return torch.where(counts >= min_count, cell_mean, row_mean.expand_as(cell_mean)).float()


def build_profile(fitter: ProfileFitter, min_count: int, latency: Tensor,
                  batch_latency: tuple[list[int], Tensor] | None = None) -> SVProfile:
    """The exported profile from the fitter's accumulated train counts; ``batch_latency``: the batch sizes and
    the ``[B, L]`` forward table of :func:`batch_latency_table` (None: the profile has none)."""
    counts = fitter.train_bins.compute()
    sizes, table = batch_latency if batch_latency is not None else (None, None)
    return SVProfile(
        x_edges=fitter.train_bins.x_edges.float(),
        y_edges=fitter.train_bins.y_edges.float(),
        table=backed_off_table(counts["sums"], counts["counts"], min_count),
        counts=counts["counts"].float(),
        latency=latency.float(),
        batch_sizes=torch.tensor(sizes, dtype=torch.int64) if sizes is not None else None,
        batch_latency_table=table.float() if table is not None else None,
    )


def batch_latency_table(target: PreTrainedModel, batches: list[int], k_max: int, context: int,
                        repeats: int) -> tuple[list[int], Tensor]:
    """Target forwards of ``B`` rows × ``1..k_max + 1`` tokens at each batch size (a verification feeds each
    row's last token and its candidates): batched SV's ``t_t(B, T)``
    (:meth:`decode.profile.SVProfile.batch_latency`)."""
    sizes = sorted(set(batches))
    return sizes, torch.tensor(forward_table(target, sizes, k_max + 1, context, repeats), dtype=torch.float64)
