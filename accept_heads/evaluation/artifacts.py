"""Exported heads and SV profiles under ``paths.head_dir``, loaded and validated against the models."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ahconf.schema import Config, ConfigError
from data_gen.models import Trio
from decode.export import load_head, load_profile
from decode.head import AcceptanceHead
from decode.profile import SVProfile
from decode.sampling import Sampling


@dataclass
class Artifacts:
    """Exported heads and SV profiles found under ``paths.head_dir``, by name."""

    heads: dict[str, AcceptanceHead] = field(default_factory=dict)
    profiles: dict[str, SVProfile] = field(default_factory=dict)


def head_name(path: Path, root: Path, timing: str) -> str:
    """A head's name: its folder under ``paths.head_dir``, or its timing when it lies in the folder itself."""
    relative = path.parent.relative_to(root).as_posix()
    return timing if relative == "." else relative


def discover(config: Config, trio: Trio, sampling: Sampling, notes: dict[str, str]) -> tuple[Artifacts, dict[str, Any]]:
    """Load every ``head.safetensors`` / ``profile.safetensors`` under ``paths.head_dir`` (validated).

    Artifacts that need the companion are left out (with a note) when no companion is configured.
    """
    root = Path(config.paths.head_dir)
    artifacts, described = Artifacts(), {"heads": {}, "profiles": {}}
    if not root.is_dir():
        notes["artifacts"] = f"no {root}: no head or SV profile to evaluate"
        return artifacts, described
    for path in sorted(root.rglob("head.safetensors")):
        try:
            head = load_head(path, draft=trio.draft, tokenizer=trio.tokenizer, sampling=sampling)
        except ValueError as error:
            raise ConfigError(f"cannot evaluate {path} with these models: {error}") from error
        name = head_name(path, root, head.config.timing)
        if head.config.companion_features and trio.companion is None:
            notes[f"head[{name}]"] = f"head[{name}] reads companion features but no companion is configured; skipped"
            continue
        artifacts.heads[name] = head.to(trio.draft.device)
        meta = head.metadata
        described["heads"][name] = {
            "path": str(path), "timing": head.config.timing, "depth": head.config.depth, "rule": meta["rule"],
            "companion_features": head.config.companion_features, "calibrated_threshold": meta.get("threshold"),
            "dev_metrics": meta.get("dev_metrics", {}), "k_min": meta.get("k_min"), "k_max": meta.get("k_max"),
            "sampling": meta["sampling"], "training_data": meta.get("training_data"), "code_version": meta.get("code_version"),
        }
    for path in sorted(root.rglob("profile.safetensors")):
        try:
            profile = load_profile(path, tokenizer=trio.tokenizer, sampling=sampling)
        except ValueError as error:
            raise ConfigError(f"cannot evaluate {path} with these models: {error}") from error
        name = head_name(path, root, "profile")
        if trio.companion is None:
            notes[f"profile[{name}]"] = f"SV profile[{name}] needs the companion model, which is not configured; skipped"
            continue
        artifacts.profiles[name] = profile
        described["profiles"][name] = {
            "path": str(path), "rule": profile.metadata["rule"], "k_max": profile.metadata.get("k_max"),
            "information": profile.metadata.get("information", {}), "latency_device": profile.metadata.get("latency_device"),
            **{key: tensor.tolist() for key, tensor in profile.tensors().items()},
        }
    return artifacts, described


