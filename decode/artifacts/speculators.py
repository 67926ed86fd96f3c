"""A feature draft with EAGLE-3's first layer as a speculators checkpoint (the format vLLM's ``eagle3`` method and
vllm-project/speculators load), and back.

A checkpoint is a directory: ``config.json`` (``speculators_model_type: eagle3``, the draft layers' Llama config under
``transformer_layer_config``, ``draft_vocab_size``, ``target_hidden_size``, the target layers read as
``eagle_aux_hidden_state_layer_ids``, the variant flags vLLM reads, and ``speculators_config`` with the proposal
method and the verifier) and ``model.safetensors``. What maps to what (``docs/library.md``, "Serving a trained draft
with vLLM"):

==============================  ==============================================================
this project                    speculators / vLLM
==============================  ==============================================================
``fuse.weight``                 ``fc.weight`` (the target layers, concatenated, → hidden)
``feature_norms.i.weight``      ``fc_norm.i.weight`` (``fc_norm``: EAGLE-3.1's per-layer norms)
``model.layers.*``              ``layers.*`` (``hidden_norm`` in the first)
``lm_head.norm.weight``         ``norm.weight``
``lm_head.weight`` (× ``down``)  ``lm_head.weight`` ``[draft_vocab_size, H]`` (a low rank multiplied out)
``lm_head.token_ids``           ``d2t`` (target id − draft id) and ``t2d`` (the subset as a mask)
``model.embed_tokens``          shared with the target (written only where they differ)
==============================  ==============================================================

The target's layer ``n`` of ``eagle_aux_hidden_state_layer_ids`` is the input of its layer ``n`` in both (a
transformers ``hidden_states[n]`` for ``n`` below the layer count; ``hidden_states[L]`` is the final norm's output
in transformers but the last layer's pre-norm output in vLLM, so a draft reading it cannot be exported), and vLLM
hands them over in increasing order.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor
from transformers import LlamaConfig, PretrainedConfig, PreTrainedModel

from decode.artifacts.gguf import file_sha256
from decode.artifacts.version import code_version
from decode.digests import Loaded
from decode.drafts import drafter_of
from decode.drafts.feature_model import FeatureDraftConfig, FeatureDraftForCausalLM

FORMAT = "speculators"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
SPECULATORS_VERSION = "0.3.0"  # the config schema written (speculators' Eagle3SpeculatorConfig)
#: Our config's own fields, which the Llama config of the draft's layers does not carry.
OWN_FIELDS = ("feature_layers", "target_hidden_size", "draft_vocab_size", "draft_head_rank", "feature_norm",
              "first_layer", "norm_before_residual", "norm_output")
#: Fields of a config that name where or how it was written, or what the draft's layers never use.
PROVENANCE_FIELDS = ("model_type", "architectures", "auto_map", "transformers_version", "_name_or_path", "dtype",
                     "torch_dtype", "id2label", "label2id", "problem_type", "output_hidden_states",
                     "output_attentions", "return_dict", "chunk_size_feed_forward", "is_encoder_decoder")


class SpeculatorsError(ValueError):
    """A draft or checkpoint that cannot go to or come from the speculators format; one line naming the fix."""


@dataclass(frozen=True)
class TargetShape:
    """What a draft must agree with in its target: ``layers`` decoder layers of ``hidden_size``, ``vocab_size``."""

    layers: int
    hidden_size: int
    vocab_size: int

    @classmethod
    def of(cls, target: PreTrainedModel | PretrainedConfig) -> TargetShape:
        config = getattr(target, "config", target)
        return cls(config.num_hidden_layers, config.hidden_size, config.vocab_size)


def check_layers(layers: list[int]) -> None:
    """The target layers read, as vLLM hands them over: distinct and increasing."""
    if list(layers) != sorted(set(layers)):
        raise SpeculatorsError(f"the draft reads the target's layers {list(layers)}; vLLM hands over distinct layers "
                               "in increasing order: train a draft reading them so (--feature-layers)")


def check_target(config: FeatureDraftConfig, target: TargetShape) -> None:
    """``config`` reads layers ``target`` has, at its width, and scores its vocabulary; else one line naming which."""
    check_layers(config.feature_layers)
    if beyond := [n for n in config.feature_layers if not 0 <= n < target.layers]:
        raise SpeculatorsError(
            f"the draft reads the target's layers {beyond}, which a {target.layers}-layer target does not hand over "
            f"(vLLM gives layer inputs 0..{target.layers - 1}; transformers' hidden_states[{target.layers}] is after "
            "the final norm): export a draft trained for this target")
    if config.target_hidden_size != target.hidden_size:
        raise SpeculatorsError(f"the draft reads features of width {config.target_hidden_size}, the target's are "
                               f"{target.hidden_size}: it was trained for another target")
    if config.vocab_size != target.vocab_size:
        raise SpeculatorsError(f"the draft's vocabulary has {config.vocab_size} tokens, the target's {target.vocab_size}: "
                               "it was trained for another target")


def check_exportable(draft: PreTrainedModel) -> FeatureDraftForCausalLM:
    """``draft`` as a feature draft vLLM's eagle3 loads; else one line naming what to train instead."""
    kind = drafter_of(draft)
    if kind.vllm_method != "eagle3":
        raise SpeculatorsError(f"{type(draft).__name__} is not a feature draft: vLLM's eagle3 method loads EAGLE-3 "
                               "drafts (python -m model_build.feature_draft --first-layer eagle3); a "
                               f"{kind.name} draft serves with vLLM's {kind.vllm_method} method as it is")
    if draft.config.first_layer != "eagle3":
        raise SpeculatorsError(
            "this feature draft's first layer is this project's fc (a projection of the token and its feature), which "
            "vLLM cannot load: train one with EAGLE-3's first layer (python -m model_build.feature_draft "
            "--first-layer eagle3)")
    check_layers(draft.config.feature_layers)
    return draft


def layer_config(config: FeatureDraftConfig) -> dict:
    """The Llama config of the draft's decoder layers (speculators' ``transformer_layer_config``)."""
    fields = {key: value for key, value in config.to_dict().items() if key not in OWN_FIELDS + PROVENANCE_FIELDS}
    layers = {key: value for key, value in LlamaConfig(**fields).to_dict().items() if key not in PROVENANCE_FIELDS}
    return {**layers, "model_type": "llama", "architectures": ["LlamaForCausalLM"], "tie_word_embeddings": False}


def speculators_config(draft: FeatureDraftForCausalLM, k: int, verifier: str, verifier_architectures: list[str],
                       record: dict) -> dict:
    """The checkpoint's ``config.json``: speculators' EAGLE-3 schema, the flags vLLM reads, and ``record``
    (this project's provenance) under ``accept_heads``."""
    config = draft.config
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "draft_vocab_size": config.draft_vocab_size,
        "target_hidden_size": config.target_hidden_size,
        "norm_before_residual": config.norm_before_residual,
        "norm_before_fc": False,
        "fc_norm": config.feature_norm,
        "norm_output": config.norm_output,
        "eagle_aux_hidden_state_layer_ids": list(config.feature_layers),
        "transformer_layer_config": layer_config(config),
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": k, "verifier_accept_k": 1,
                                  "accept_tolerance": 0.0}],
            "verifier": {"name_or_path": verifier, "architectures": verifier_architectures},
        },
        "accept_heads": record,
    }


def speculators_tensors(draft: FeatureDraftForCausalLM, target_embeddings: Tensor | None = None) -> dict[str, Tensor]:
    """The draft's tensors under speculators' names (the module docstring's table), in the draft's dtype;
    ``embed_tokens.weight`` only where ``target_embeddings`` differ from the draft's."""
    state = draft.state_dict()
    head = draft.lm_head
    rows = head.weight.detach().float()  # [S, rank or H]
    if head.down is not None:
        rows = rows @ head.down.weight.detach().float()  # [S, H]: the low rank multiplied out
    subset = head.token_ids.long()  # [S] target ids
    tensors = {"fc.weight": state["fuse.weight"], "lm_head.weight": rows.to(draft.dtype),
               "d2t": subset - torch.arange(len(subset)),
               "t2d": torch.zeros(draft.config.vocab_size, dtype=torch.bool).index_fill_(0, subset, True)}
    tensors["norm.weight"] = state["model.norm.weight" if draft.config.norm_output else "lm_head.norm.weight"]
    for name, value in state.items():
        if name.startswith("model.layers."):
            tensors[name.removeprefix("model.")] = value
        elif name.startswith("feature_norms."):
            tensors[name.replace("feature_norms.", "fc_norm.")] = value
    embeddings = state["model.embed_tokens.weight"]
    if target_embeddings is None or not torch.equal(target_embeddings.to(embeddings.dtype), embeddings):
        tensors["embed_tokens.weight"] = embeddings
    return {name: value.detach().contiguous() for name, value in tensors.items()}


def export_speculators(draft: PreTrainedModel, out: Path, *, target: PreTrainedModel | None = None, k: int = 3,
                       verifier: str | None = None, record: dict | None = None) -> Path:
    """Write ``draft`` (EAGLE-3's first layer) to ``out`` as a speculators checkpoint, whole or not at all (written
    beside and renamed into place); with ``target``, checked against it first and its embeddings shared."""
    draft = check_exportable(draft)
    if target is not None:
        check_target(draft.config, TargetShape.of(target))
    embeddings = target.get_input_embeddings().weight.detach() if target is not None else None
    tensors = speculators_tensors(draft, embeddings)
    name = verifier or (getattr(target.config, "_name_or_path", "") if target is not None else "") or "unknown"
    architectures = list(getattr(target.config, "architectures", None) or ["LlamaForCausalLM"]) if target else [
        "LlamaForCausalLM"]
    provenance = {"exported_by": "decode.artifacts.speculators", "code_version": code_version(), **(record or {})}
    staging = out.with_name(f".{out.name}.partial")
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    save_file(tensors, staging / WEIGHTS_FILE, metadata={"format": "pt"})
    provenance["weights_sha256"] = file_sha256(staging / WEIGHTS_FILE)
    config = speculators_config(draft, k, name, architectures, provenance)
    (staging / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    if out.exists():
        shutil.rmtree(out)
    staging.rename(out)
    return out


def read_config(path: Path) -> dict:
    """A speculators checkpoint's ``config.json``, checked to be an EAGLE-3 one this project can run."""
    file = Path(path) / CONFIG_FILE
    if not file.is_file():
        raise SpeculatorsError(f"{path} has no {CONFIG_FILE}: pass a speculators checkpoint's directory")
    doc = json.loads(file.read_text())
    kind = doc.get("speculators_model_type")
    if kind != "eagle3":
        raise SpeculatorsError(f"{path} is a {kind or 'non-speculators'} checkpoint; this project reads EAGLE-3 "
                               "speculators checkpoints (speculators_model_type: eagle3)")
    if doc.get("norm_before_fc"):
        raise SpeculatorsError(f"{path} normalises the target's layers together before fc (norm_before_fc), which "
                               "this project's EAGLE-3 layer does not: per-layer norms (fc_norm) it reads")
    if "transformer_layer_config" not in doc:
        raise SpeculatorsError(f"{path}'s config lacks transformer_layer_config: not a speculators checkpoint")
    return doc


def config_of(doc: dict, target: TargetShape) -> FeatureDraftConfig:
    """Our config of a speculators EAGLE-3 config (vLLM's defaults where a field is absent)."""
    layers = {key: value for key, value in doc["transformer_layer_config"].items() if key not in PROVENANCE_FIELDS}
    aux = doc.get("eagle_aux_hidden_state_layer_ids") or sorted({2, target.layers // 2, target.layers - 3})
    return FeatureDraftConfig(**{**layers, "tie_word_embeddings": False}, feature_layers=list(aux),
                              target_hidden_size=doc.get("target_hidden_size") or target.hidden_size,
                              draft_vocab_size=doc.get("draft_vocab_size") or layers["vocab_size"],
                              feature_norm=bool(doc.get("fc_norm", False)), first_layer="eagle3",
                              norm_before_residual=bool(doc.get("norm_before_residual", True)),
                              norm_output=bool(doc.get("norm_output", False)))


def recorded_weights(doc: dict) -> str | None:
    """The weights' sha256 a checkpoint this project exported records (``accept_heads``'s ``weights_sha256``); None
    for one exported elsewhere."""
    return (doc.get("accept_heads") or {}).get("weights_sha256")


def check_weights(path: Path, doc: dict) -> None:
    """Refuse weights whose sha256 is not the one the checkpoint records (:func:`recorded_weights`); one that records
    none is read as it is."""
    recorded = recorded_weights(doc)
    if recorded is not None and (actual := file_sha256(path / WEIGHTS_FILE)) != recorded:
        raise SpeculatorsError(f"{path / WEIGHTS_FILE} is corrupt or was edited: it hashes to {actual[:12]}…, its "
                               f"{CONFIG_FILE} records {recorded[:12]}…; export it again, or load it with "
                               "verify=False to use it as it is")


def load_speculators(path: str | Path, target: PreTrainedModel, dtype: torch.dtype | None = None,
                     verify: bool = True) -> FeatureDraftForCausalLM:
    """The speculators EAGLE-3 checkpoint at ``path`` as this project's feature draft for ``target`` (its
    embeddings the target's unless the checkpoint has its own); refused with one line where its target layers,
    width or vocabulary disagree with ``target``, or (``verify``) where its weights are not those this project
    exported (:func:`check_weights`)."""
    doc = read_config(Path(path))
    config = config_of(doc, TargetShape.of(target))
    check_target(config, TargetShape.of(target))
    recorded = recorded_weights(doc) is not None
    if verify:
        check_weights(Path(path), doc)
    tensors = load_file(str(Path(path) / WEIGHTS_FILE))
    with torch.random.fork_rng(devices=[]):
        draft = FeatureDraftForCausalLM(config)
    state = {f"model.{name}": value for name, value in tensors.items() if name.startswith(("layers.", "embed_tokens."))}
    state["fuse.weight"] = tensors["fc.weight"]
    state.setdefault("model.embed_tokens.weight", target.get_input_embeddings().weight.detach())
    state["lm_head.weight"] = tensors["lm_head.weight"]
    state["model.norm.weight" if config.norm_output else "lm_head.norm.weight"] = tensors["norm.weight"]
    state.update({name.replace("fc_norm.", "feature_norms."): value for name, value in tensors.items()
                  if name.startswith("fc_norm.")})
    subset = torch.arange(config.draft_vocab_size) + tensors["d2t"].long() if "d2t" in tensors else torch.arange(
        config.draft_vocab_size)
    state["lm_head.token_ids"] = subset
    if missing := sorted(set(draft.state_dict()) - set(state)):
        raise SpeculatorsError(f"{path} lacks {missing}: not an EAGLE-3 checkpoint of this shape")
    dtype = dtype or tensors["fc.weight"].dtype
    draft.load_state_dict({k: v if v.dtype == torch.long else v.to(dtype) for k, v in state.items()}, strict=True)
    draft.generation_config = target.generation_config
    if recorded:
        draft.loaded = Loaded(str(Path(path) / WEIGHTS_FILE), verify)
    return draft.to(dtype).eval()
