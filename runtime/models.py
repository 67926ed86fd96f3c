"""Turn a models config into loaded target / draft / companion models and their tokenizer."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ahconf.schema import ModelsConfig, ModelSpec
from decode.artifacts.hub import ModelLoadError, load_causal_lm, load_tokenizer, tokenizer_hash
from decode.json_types import JSONDict
from decode.loops.runner import vocab_size
from runtime.schemes import resolve_id


@dataclass(frozen=True)
class ModelDescription:
    """One loaded model of a trio: what was configured and what it resolved to."""

    id: str  # as configured (a hub id, a path, zoo:<role>, real:<pair>/<role>)
    resolved: str  # the hub id or local path it was loaded from
    revision: str | None  # the configured revision (None: the default branch)
    dtype: str  # the configured dtype (auto, bfloat16, ...)


@dataclass(frozen=True)
class TrioDescription:
    """What identifies a loaded trio: its models, their shared tokenizer and vocabulary.

    Its JSON form (:meth:`to_dict`) keys the stored cost profiles and the collected data, and the results record it.
    """

    name: str  # models.name
    tokenizer_hash: str  # decode.artifacts.hub.tokenizer_hash of the shared tokenizer
    vocab_size: int  # the vocabulary every model's logits are sliced to (Trio.vocab)
    target: ModelDescription
    draft: ModelDescription
    companion: ModelDescription | None = None  # None: loaded without one

    def to_dict(self) -> JSONDict:
        """The JSON form: every field, ``companion`` only where there is one."""
        data = asdict(self)
        if self.companion is None:
            del data["companion"]
        return data


def shared_vocab(*models: PreTrainedModel | None) -> int:
    """The vocabulary every model's logits are sliced to: the decoder's ``min`` of :func:`vocab_size`."""
    return min(vocab_size(m) for m in models if m is not None)


@dataclass
class Trio:
    """Loaded models (companion optional) sharing one tokenizer, plus what identifies them."""

    target: PreTrainedModel
    draft: PreTrainedModel
    companion: PreTrainedModel | None
    tokenizer: PreTrainedTokenizerBase
    description: TrioDescription

    @property
    def vocab(self) -> int:
        """The shared vocabulary every model's logits are sliced to (:func:`shared_vocab`)."""
        return shared_vocab(self.target, self.draft, self.companion)


def resolve_model_id(spec: ModelSpec, zoo_dir: str | None = None) -> str:
    """A hub id, local path or ``.gguf`` file as given; ``zoo:<role>`` becomes the built-in zoo's directory and
    ``real:<pair>/<role>`` the real pair's (each installed on first use, by its resolver in :mod:`runtime.schemes`)."""
    return resolve_id(spec.id, zoo_dir)


def _load(spec: ModelSpec, zoo_dir: str | None, verify: bool) -> tuple[str, PreTrainedModel]:
    path = resolve_model_id(spec, zoo_dir)
    return path, load_causal_lm(path, revision=spec.revision, dtype=spec.dtype, device_map=spec.device_map,
                                verify=verify)


def load_trio(models: ModelsConfig, zoo_dir: str | None = None, *, with_companion: bool = True,
              verify: bool = True) -> Trio:
    """Load the configured models; every model must share the target's tokenizer. A directory this project built is
    checked against its record first (``verify=False``: not; :func:`decode.artifacts.hub.load_causal_lm`)."""
    target_path, target = _load(models.target, zoo_dir, verify)
    draft_path, draft = _load(models.draft, zoo_dir, verify)
    companion_path, companion = (None, None)
    if with_companion and models.companion is not None:
        companion_path, companion = _load(models.companion, zoo_dir, verify)
    tokenizer = load_tokenizer(target_path, revision=models.target.revision)
    reference = tokenizer_hash(tokenizer)
    hashes = {"target": reference}
    for role, path, spec in (("draft", draft_path, models.draft), ("companion", companion_path, models.companion)):
        if path is None:
            continue
        hashes[role] = tokenizer_hash(load_tokenizer(path, revision=spec.revision))
        if hashes[role] != reference:
            raise ModelLoadError(
                f"the {role} '{spec.id}' uses a different tokenizer from the target '{models.target.id}'; "
                "speculative decoding needs one shared vocabulary — pick models of the same family"
            )
    for role, model in (("target", target), ("draft", draft), ("companion", companion)):
        if model is not None and vocab_size(model) < len(tokenizer):
            raise ModelLoadError(f"the {role}'s vocabulary is smaller than its tokenizer's; the checkpoint is "
                                 "inconsistent")
    described = {role: ModelDescription(spec.id, str(path), spec.revision, spec.dtype)
                 for role, path, spec in (("target", target_path, models.target), ("draft", draft_path, models.draft),
                                          ("companion", companion_path, models.companion))
                 if path is not None and spec is not None}
    description = TrioDescription(models.name, reference, shared_vocab(target, draft, companion), **described)
    return Trio(target, draft, companion, tokenizer, description)

