"""Evaluation inputs written without training: random heads and an SV profile with the metadata training records."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from decode import AcceptanceHead, HeadConfig, Sampling, SVProfile, rules, save_head, save_profile
from decode.artifacts.hub import load_tokenizer, tokenizer_hash
from decode.head import PRE_FEATURES
from decode.metadata import ArtifactMetadata, HeadMetadata, InformationGain, ProfileMetadata
from tests.helpers.config import DATA_OVERRIDES, EVAL_OVERRIDES, model_overrides


def write_artifacts(head_dir: Path, tokenizer_path: Path) -> None:
    """A pre and a post head (random weights) and an SV profile, with the metadata training writes."""
    common = ArtifactMetadata(draft="micro-draft", tokenizer_hash=tokenizer_hash(load_tokenizer(str(tokenizer_path))),
                              rule=rules.Speculative().spec(), sampling=Sampling(), seed=0)
    torch.manual_seed(0)
    for timing, features in (("pre", PRE_FEATURES), ("post", ())):
        (head_dir / timing).mkdir(parents=True)
        head = AcceptanceHead(HeadConfig(hidden_size=32, depth=1, timing=timing, features=features))
        save_head(head, head_dir / timing / "head.safetensors", HeadMetadata.extending(
            common, head_config=head.config, k_min=1, k_max=4, dev_metrics={"val/auroc": 0.5},
            train_config={"head": {"mixing_r": 0.15}}))
    profile = SVProfile(x_edges=torch.tensor([0.0, 0.5, 1.0]), y_edges=torch.tensor([0.0, 0.3, 0.7, 1.0]),
                        table=torch.rand(2, 3), counts=torch.full((2, 3), 30.0), latency=torch.tensor([1.0, 1.05, 1.1]))
    information = {s: InformationGain(h_a=1.0, h_a_given_xy=0.6, gain=0.4, gain_fraction=0.4) for s in ("train", "dev")}
    save_profile(profile, head_dir / "profile.safetensors",
                 ProfileMetadata.extending(common, bins=profile.bins, k_max=3, information=information))


def evaluation_config(make_config: Callable[..., Any], micro_trio: dict[str, Path], root: Path, *overrides: str) -> Any:
    """The config of an evaluation of the micro trio on the session's micro data, with :func:`write_artifacts`'s heads
    and profile written under ``root / "heads"`` and its outputs under ``root`` (``overrides`` last)."""
    write_artifacts(root / "heads", micro_trio["draft"])
    return make_config(*model_overrides(micro_trio), *DATA_OVERRIDES, *EVAL_OVERRIDES, f"paths.root={root}",
                       f"paths.head_dir={root / 'heads'}", *overrides)
