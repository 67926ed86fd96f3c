"""Safetensors files for heads and SV profiles, with validated metadata in the header.

The header's ``metadata`` (str → str) holds one JSON document under :data:`METADATA_KEY` with the
artifact kind, format and code versions, the head config / profile shape, the draft id, its
hidden size, the tokenizer hash, the rule (name + params) and the sampling transform.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, safe_open, save_file
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from decode.head import AcceptanceHead, HeadConfig
from decode.hub import tokenizer_hash
from decode.profile import SVProfile
from decode import rules
from decode.rules import Rule
from decode.sampling import Sampling
from decode.version import code_version

METADATA_KEY = "accept_heads"
FORMAT_VERSION = 1
#: Keys the caller must supply when saving: they describe how the training labels were made.
REQUIRED_KEYS = ("draft", "tokenizer_hash", "rule", "sampling")


def _header(kind: str, metadata: dict[str, Any], extra: dict[str, Any]) -> dict[str, str]:
    missing = [key for key in REQUIRED_KEYS if key not in metadata]
    if missing:
        raise ValueError(f"{kind} metadata lacks {missing}; required keys: {', '.join(REQUIRED_KEYS)}")
    doc = {**metadata, **extra, "kind": kind, "format_version": FORMAT_VERSION, "code_version": code_version()}
    if isinstance(doc["rule"], Rule):
        doc["rule"] = doc["rule"].spec()
    if isinstance(doc["sampling"], Sampling):
        doc["sampling"] = doc["sampling"].to_dict()
    return {METADATA_KEY: json.dumps(doc, sort_keys=True)}


def _read(path: str | Path, kind: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{kind} file not found: {path}")
    try:
        with safe_open(str(path), framework="pt") as handle:
            header = handle.metadata() or {}
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as error:
        raise ValueError(f"{path} is not a readable safetensors {kind} file ({error})") from error
    if METADATA_KEY not in header:
        raise ValueError(f"{path} has no '{METADATA_KEY}' metadata: not a {kind} file written by decode.export")
    try:
        doc = json.loads(header[METADATA_KEY])
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: corrupt '{METADATA_KEY}' metadata ({error})") from error
    if doc.get("kind") != kind:
        raise ValueError(f"{path} holds a {doc.get('kind')!r} artifact, expected {kind!r}")
    if doc.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{path}: format version {doc.get('format_version')} unsupported (this code reads {FORMAT_VERSION})")
    return tensors, doc


def check_compatibility(
    doc: dict[str, Any],
    source: str,
    *,
    tokenizer: PreTrainedTokenizerBase | None = None,
    sampling: Sampling | None = None,
    rule: Rule | None = None,
) -> None:
    """Raise on a rule or tokenizer mismatch with an artifact's metadata; warn on a sampling mismatch."""
    if rule is not None and doc.get("rule") != rule.spec():
        raise ValueError(
            f"{source} was trained for rule {doc.get('rule')} but the decoder uses {rule.spec()}; "
            f"decode with rules.from_spec(**{doc.get('rule')}) or train on data labelled with {rule.spec()}"
        )
    if tokenizer is not None and doc.get("tokenizer_hash") != tokenizer_hash(tokenizer):
        raise ValueError(
            f"{source} was made with tokenizer hash {doc.get('tokenizer_hash')} but the given tokenizer hashes to "
            f"{tokenizer_hash(tokenizer)}; use the tokenizer of draft {doc.get('draft')!r}"
        )
    if sampling is None:
        return
    decoding = decoding_transform(doc, sampling, rule)
    if doc.get("sampling") != decoding.to_dict():
        warnings.warn(
            f"{source} was fitted on data sampled under {doc.get('sampling')} but decoding generates under "
            f"{decoding.to_dict()}; its acceptance estimates may be off",
            stacklevel=3,
        )


def decoding_transform(doc: dict[str, Any], sampling: Sampling, rule: Rule | None) -> Sampling:
    """The transform text is generated under when decoding with ``sampling`` and the artifact's rule
    (the greedy rule always generates greedily, whatever ``sampling`` says)."""
    if rule is None and isinstance(doc.get("rule"), dict):
        try:
            rule = rules.from_spec(doc["rule"]["name"], **doc["rule"].get("params", {}))
        except (KeyError, TypeError, ValueError):
            return sampling
    return rule.transform(sampling) if rule is not None else sampling


def save_head(head: AcceptanceHead, path: str | Path, metadata: dict[str, Any]) -> None:
    """Write a head's weights and metadata (must include :data:`REQUIRED_KEYS`) to ``path``."""
    extra = {"head_config": head.config.to_dict(), "hidden_size": head.config.hidden_size}
    tensors = {name: t.detach().cpu().contiguous() for name, t in head.state_dict().items()}
    save_file(tensors, str(path), metadata=_header("head", metadata, extra))


def load_head(
    path: str | Path,
    *,
    draft: PreTrainedModel | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    sampling: Sampling | None = None,
    rule: Rule | None = None,
) -> AcceptanceHead:
    """Load a head saved by :func:`save_head`, validated against the given draft / tokenizer / rule.

    The metadata is available as ``head.metadata``.
    """
    tensors, doc = _read(path, "head")
    config = HeadConfig.from_dict(doc["head_config"])
    if draft is not None:
        draft_hidden = draft.config.get_text_config(decoder=True).hidden_size
        if draft_hidden != config.hidden_size:
            raise ValueError(
                f"head {path} expects draft hidden size {config.hidden_size} (draft {doc.get('draft')!r}) but the "
                f"given draft has {draft_hidden}; load the head with the draft it was trained on"
            )
    check_compatibility(doc, f"head {path}", tokenizer=tokenizer, sampling=sampling, rule=rule)
    head = AcceptanceHead(config)
    try:
        head.load_state_dict(tensors)
    except RuntimeError as error:
        raise ValueError(f"head {path}: weights do not match its config {config} ({error})") from error
    head.metadata = doc
    return head.eval()


def save_profile(profile: SVProfile, path: str | Path, metadata: dict[str, Any]) -> None:
    """Write an SV profile's tables and metadata (must include :data:`REQUIRED_KEYS`) to ``path``."""
    extra = {"bins": [profile.x_edges.numel() - 1, profile.y_edges.numel() - 1]}
    tensors = {name: t.detach().cpu().contiguous() for name, t in profile.tensors().items()}
    save_file(tensors, str(path), metadata=_header("sv_profile", metadata, extra))


def load_profile(
    path: str | Path,
    *,
    tokenizer: PreTrainedTokenizerBase | None = None,
    sampling: Sampling | None = None,
    rule: Rule | None = None,
) -> SVProfile:
    """Load a profile saved by :func:`save_profile`, validated like :func:`load_head`."""
    tensors, doc = _read(path, "sv_profile")
    check_compatibility(doc, f"profile {path}", tokenizer=tokenizer, sampling=sampling, rule=rule)
    try:
        return SVProfile(**tensors, metadata=doc)
    except TypeError as error:
        raise ValueError(f"profile {path}: unexpected tensors {sorted(tensors)} ({error})") from error
