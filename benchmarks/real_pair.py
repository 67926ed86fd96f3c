"""A real pair's models for a benchmark, or one error line and exit status 2."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from decode.artifacts.hub import ModelLoadError, load_causal_lm, load_tokenizer, resolve_dtype
from model_build.real import ensure_pair, pair_spec
from model_build.real.feature import ROLE
from model_build.real.pairs import PairSpec


@dataclass(frozen=True)
class RealPair:
    """The pair's spec (its prompts), its models by role in the pair's precision, the target's tokenizer and files."""

    spec: PairSpec
    models: dict[str, PreTrainedModel]
    tokenizer: PreTrainedTokenizerBase
    dtype: torch.dtype
    target_dir: Path


def load_real_pair(name: str, roles: tuple[str, ...]) -> RealPair:
    """Install (first use) and load ``roles`` of the real pair ``name``; a missing pair or feature draft exits."""
    try:
        spec = pair_spec(name)
        pair = ensure_pair(name)
        if ROLE in roles and ROLE not in pair.roles:
            raise ModelLoadError(f"the {name} pair ships no feature draft; train and ship one first "
                                 "(python -m model_build.feature_draft, then python -m model_build.real --ship-feature-draft)")
        dtype = resolve_dtype(spec.dtype)
        models = {role: load_causal_lm(str(pair.path(role)), dtype=dtype) for role in roles}
    except (KeyError, ModelLoadError) as error:
        print(f"error: {error.args[0] if isinstance(error, KeyError) else error}", file=sys.stderr)
        sys.exit(2)
    return RealPair(spec, models, load_tokenizer(str(pair.path("target"))), dtype, Path(pair.path("target")))
