"""Turn a models config into loaded target / draft / companion models and their tokenizer."""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ahconf.schema import ModelsConfig, ModelSpec
from decode.artifacts.hub import ModelLoadError, load_causal_lm, load_tokenizer, tokenizer_hash
from decode.json_types import JSONDict
from decode.loops.runner import vocab_size
from runtime.schemes import resolve_id


@dataclass
class Trio:
    """Loaded models (companion optional) sharing one tokenizer, plus what identifies them."""

    target: PreTrainedModel
    draft: PreTrainedModel
    companion: PreTrainedModel | None
    tokenizer: PreTrainedTokenizerBase
    description: JSONDict

    @property
    def vocab(self) -> int:
        """The shared vocabulary every model's logits are sliced to: the decoder's ``min`` of :func:`vocab_size`."""
        return min(vocab_size(m) for m in (self.target, self.draft, self.companion) if m is not None)


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
    description = {
        "name": models.name,
        "tokenizer_hash": reference,
        **{
            role: {"id": spec.id, "resolved": str(path), "revision": spec.revision, "dtype": spec.dtype}
            for role, path, spec in (
                ("target", target_path, models.target),
                ("draft", draft_path, models.draft),
                ("companion", companion_path, models.companion),
            )
            if path is not None and spec is not None
        },
    }
    for role, model in (("target", target), ("draft", draft), ("companion", companion)):
        if model is not None and vocab_size(model) < len(tokenizer):
            raise ModelLoadError(f"the {role}'s vocabulary is smaller than its tokenizer's; the checkpoint is inconsistent")
    trio = Trio(target, draft, companion, tokenizer, description)
    description["vocab_size"] = trio.vocab
    return trio

