"""Head reliability: predicted acceptance vs the label on dev positions, and its reliability statistics.

:func:`head_predictions` recomputes the positions as in training: the dev split collected at
``paths.data_dir`` is mixed with the head's own ``r`` and seed (dev draw, epoch 0: the exact positions
of the head's dev metrics) and scored by the frozen draft + head. :func:`reliability` and
:func:`expected_calibration_error` bin such a frame (the notebooks import them).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from accept_heads.training.features import head_encoder
from accept_heads.training.training_data import (
    SequenceDataset,
    collate_sequences,
    labelled_positions,
    load_positions,
    loss_everywhere,
    mix_batch,
)
from data_gen.manifest import read_manifest
from decode.head import AcceptanceHead
from runtime.models import Trio

BATCH = 8


@torch.inference_mode()
def head_predictions(head: AcceptanceHead, trio: Trio, data_dir: str, rows: int,
                     default_r: float, default_seed: int) -> pd.DataFrame:
    """``pred`` (σ of the head) and ``label`` (the rule's acceptance) at the loss positions of ``rows`` dev rows (a
    feature draft's: at every depth its head was trained on)."""
    recorded = head.metadata
    rule, sampling = recorded.build_rule(), recorded.sampling
    r = default_r if recorded.mixing_r is None else recorded.mixing_r
    seed = default_seed if recorded.seed is None else recorded.seed
    table = load_positions(data_dir, "dev", rule, seed=seed, with_companion=head.config.companion_features,
                           depths=head.config.depths)
    dataset = SequenceDataset(table)
    manifest, _ = read_manifest(data_dir)
    encoder = head_encoder(trio.draft, head.config, rule.transform(sampling), manifest.vocab_size, trio.target)
    preds, labels = [], []
    for start in range(0, min(rows, len(dataset)), BATCH):
        items = [dataset[i] for i in range(start, min(start + BATCH, rows, len(dataset)))]
        batch = mix_batch(collate_sequences(items), r, seed, "dev", 0,
                          every_position=loss_everywhere(head.config.timing))
        mask = batch["loss_mask"]
        hidden, features, label, _ = labelled_positions(*encoder(batch), batch["label"][mask], batch["outcome"][mask])
        preds.append(head.predict(hidden, features).cpu().numpy())
        labels.append(label.numpy())
    pred = np.concatenate(preds) if preds else np.zeros(0)
    label = np.concatenate(labels) if labels else np.zeros(0)
    return pd.DataFrame({"pred": pred.astype(np.float32), "label": label.astype(np.float32)})


def reliability(frame: pd.DataFrame, bins: int = 10) -> pd.DataFrame:
    """Equal-width bins of the prediction: mean prediction, mean label, the mean label's standard error (positions
    taken as independent, so a lower bound on its spread; NaN for a bin of one) and count per bin."""
    edges = np.linspace(0.0, 1.0, bins + 1)
    index = np.clip(np.digitize(frame["pred"], edges[1:-1]), 0, bins - 1)
    grouped = frame.assign(bin=index).groupby("bin")
    count = grouped.size()
    out = pd.DataFrame({"pred": grouped["pred"].mean(), "label": grouped["label"].mean(),
                        "label_se": grouped["label"].std(ddof=1) / np.sqrt(count), "count": count})
    return out.reindex(range(bins)).assign(lo=edges[:-1], hi=edges[1:])


def expected_calibration_error(frame: pd.DataFrame, bins: int = 15) -> float:
    """ECE with equal-width bins and soft labels."""
    table = reliability(frame, bins).dropna(subset=["pred"])
    if table.empty:
        return float("nan")
    return float((table["count"] * (table["pred"] - table["label"]).abs()).sum() / table["count"].sum())
