"""A real pair's feature draft (:mod:`model_build.feature_draft`): installed beside its draft, measured, shipped.

Its trained tensors ship as ``model_build/real/<name>/feature_draft.safetensors`` (bf16, with the draft's config in
the file's metadata); the install assembles ``feature_draft/`` from them and the target's embeddings. Its
record (recipe, data, training, realism by depth) lives under ``feature_draft`` in ``pair.json``. Maintainers
ship a trained one with ``python -m model_build.real --ship-feature-draft DIR`` (``DIR``: what
``python -m model_build.feature_draft`` wrote; :func:`model_build.real.pair_store.ship_feature_draft`); the one it
replaces stays installable as ``feature_draft_previous`` (``real:<name>/feature_draft_previous``), its file and
record moved under that name.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import PreTrainedModel

from ahconf.schema import FEATURE_DRAFT_ROLE, PREVIOUS_FEATURE_DRAFT_ROLE
from decode.artifacts.hub import load_causal_lm, load_tokenizer, resolve_dtype
from decode.drafts.feature_model import FeatureDraftConfig
from model_build.feature_draft.model import assemble_draft
from model_build.feature_draft.realism import FeatureRealism, measure_feature_realism

from .pairs import RECORD_FILE, PairSpec

ROLE = FEATURE_DRAFT_ROLE
PREVIOUS_ROLE = PREVIOUS_FEATURE_DRAFT_ROLE
ROLES = (ROLE, PREVIOUS_ROLE)  # the shipped feature draft, then the one it replaced
TRAINED_FILE = "trained.safetensors"  # as model_build.feature_draft writes it
REALISM_DEPTHS = 6  # depths of a round measured


def shipped_file(role: str) -> str:
    """The file a feature-draft role's trained tensors ship in."""
    return f"{role}.safetensors"


def load_shipped(path: Path, target: PreTrainedModel, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """The feature draft assembled from its shipped tensors (config in their metadata) and ``target``."""
    with safe_open(str(path), "pt") as handle:
        config = FeatureDraftConfig.from_dict(json.loads(handle.metadata()["config"]))
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118 (a safetensors handle)
    return assemble_draft(target, config, tensors, dtype)


def realism_of(spec: PairSpec, pair_root: Path, draft_dir: Path,
               beside: FeatureRealism | None = None) -> FeatureRealism:
    """The feature draft's realism by depth on the pair's realism sets, the pair's draft beside it; ``beside``: the
    realism of a draft it is compared with, whose measured verification costs price this one too."""
    from .build import realism_sets
    from .recipe import PairRecipe

    record = json.loads((pair_root / RECORD_FILE).read_text())
    recipe = PairRecipe.from_dict(record["recipe"])
    tokenizer = load_tokenizer(str(pair_root / "target"))
    dtype = resolve_dtype(spec.dtype)
    models = {"target": load_causal_lm(str(pair_root / "target"), dtype=dtype),
              "draft": load_causal_lm(str(pair_root / "draft"), dtype=dtype),
              ROLE: load_causal_lm(str(draft_dir), dtype=dtype)}
    return measure_feature_realism(models, tokenizer, realism_sets(spec, tokenizer, recipe),
                                   tokens=recipe.realism_tokens, seed=recipe.seed, repeats=recipe.latency_repeats,
                                   depths=REALISM_DEPTHS, dtype=str(models["target"].dtype).split(".")[-1],
                                   verify=beside.verify_costs if beside is not None else None)
