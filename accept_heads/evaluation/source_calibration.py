"""Each acceptance source's calibration in decoding: the ``P̂`` its policy judged each candidate by, against the
outcome verification observed (candidates up to and including a round's first rejection), per set, rule and source
at its dev choice: AUROC, ECE and Brier (:func:`accept_heads.training.metrics.outcome_calibration`).

Scored where the decoder stops on them, the estimates are the ones that mattered; the sample is each policy's own
(a source that drafts further is scored deeper into its rounds), so a column compares sources on their own terms.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from accept_heads.evaluation.table import at_dev_choice
from accept_heads.measure.families import family_names
from accept_heads.training.metrics import outcome_calibration

#: The columns that identify a source's run.
RUN = ["set", "role", "rule", "rule_param", "family", "artifact", "param"]


def source_calibration(generations: pd.DataFrame) -> pd.DataFrame:
    """One row per league source's run at its dev choice (dev, test and OOD): ``n`` scored candidates, their
    acceptance rate and mean ``P̂``, AUROC, ECE and Brier."""
    league = family_names(league="learned") + family_names(league="training-free")
    rows = generations[generations["family"].isin(league) & at_dev_choice(generations)]
    out = []
    for key, group in rows.groupby(RUN, dropna=False, sort=False):
        probs = np.concatenate([np.asarray(e, dtype=float) for e in group["estimates"]])
        outcomes = np.concatenate([np.asarray(o, dtype=float) for o in group["estimate_outcomes"]])
        if probs.size == 0:
            continue
        scores = outcome_calibration(torch.from_numpy(probs), torch.from_numpy(outcomes))
        out.append({**dict(zip(RUN, key)), "n": int(probs.size), "accept_rate": float(outcomes.mean()),
                    "mean_estimate": float(probs.mean()), **scores})
    return pd.DataFrame(out, columns=[*RUN, "n", "accept_rate", "mean_estimate", "auroc", "ece", "brier"])
