"""Head calibration data: predicted acceptance vs the label on dev positions, recomputed as in training.

The dev split collected at ``paths.data_dir`` is mixed with the head's own ``r`` and seed (dev draw,
epoch 0: the exact positions of the head's dev metrics) and scored by the frozen draft + head.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from transformers import PreTrainedModel

from accept_heads.data import SequenceDataset, collate_sequences, load_positions, loss_everywhere, mix_batch
from accept_heads.features import DraftFeatures
from decode import rules as rule_defs
from decode.head import AcceptanceHead
from decode.sampling import Sampling

BATCH = 8


@torch.inference_mode()
def head_predictions(head: AcceptanceHead, draft: PreTrainedModel, data_dir: str, rows: int,
                     default_r: float, default_seed: int) -> pd.DataFrame:
    """``pred`` (σ of the head) and ``label`` (the rule's acceptance) at the loss positions of ``rows`` dev rows."""
    meta = head.metadata
    rule = rule_defs.from_spec(meta["rule"]["name"], **meta["rule"]["params"])
    sampling = Sampling.from_dict(meta["sampling"])
    r = meta.get("train_config", {}).get("head", {}).get("mixing_r", default_r)
    seed = meta.get("seed", default_seed)
    table = load_positions(data_dir, "dev", rule, seed=seed, with_companion=head.config.companion_features)
    dataset = SequenceDataset(table)
    encoder = DraftFeatures(draft, head.config, rule.transform(sampling))
    preds, labels = [], []
    for start in range(0, min(rows, len(dataset)), BATCH):
        items = [dataset[i] for i in range(start, min(start + BATCH, rows, len(dataset)))]
        batch = mix_batch(collate_sequences(items), r, seed, "dev", 0,
                          every_position=loss_everywhere(head.config.timing))
        hidden, features = encoder(batch)
        preds.append(head.predict(hidden, features).cpu().numpy())
        labels.append(batch["label"][batch["loss_mask"]].numpy())
    pred = np.concatenate(preds) if preds else np.zeros(0)
    label = np.concatenate(labels) if labels else np.zeros(0)
    return pd.DataFrame({"pred": pred.astype(np.float32), "label": label.astype(np.float32)})

