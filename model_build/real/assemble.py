"""A student (draft or companion) as target layers plus trained tensors: split one for shipping, put one together.

A student of shape :class:`StudentShape` is the target's embeddings and first ``target_layers`` layers,
then its trained layers and final norm, then an output layer: the target's tied embeddings, or a
:class:`decode.subset_vocab.SubsetVocabHead` whose rows are the target's embeddings of the subset (or
trained from them).
Only the trained tensors and the subset's ids ship with the project (:func:`trained_tensors`);
:func:`assemble` copies everything else out of the target, with no arithmetic, so the assembled
checkpoint has the same bytes on every machine.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel

from decode.subset_vocab import SubsetVocabLlamaConfig, SubsetVocabLlamaForCausalLM

from .recipe import StudentShape

SUBSET_IDS = "lm_head.token_ids"


def student_config(target: LlamaConfig, shape: StudentShape) -> LlamaConfig:
    """The target's config at the student's depth, with a subset-vocabulary head where the shape has one."""
    dropped = ("architectures", "model_type", "transformers_version")
    fields = {k: v for k, v in target.to_dict().items() if k not in dropped}
    fields["num_hidden_layers"] = shape.layers
    if shape.vocab_subset is None:
        return LlamaConfig(**{**fields, "tie_word_embeddings": True})
    return SubsetVocabLlamaConfig(**{**fields, "tie_word_embeddings": False, "draft_vocab_size": shape.vocab_subset})


def trained_names(shape: StudentShape, model: PreTrainedModel) -> list[str]:
    """The state-dict names of the trained tensors: the trained layers, the final norm (and a trained head)."""
    first = f"model.layers.{shape.target_layers}."
    names = [n for n in model.state_dict() if n.startswith("model.layers.")
             and int(n.split(".")[2]) >= shape.target_layers]
    assert any(n.startswith(first) for n in names), "the student has no trained layer"
    return [*names, "model.norm.weight", *(["lm_head.weight"] if shape.trained_head else [])]


def trained_tensors(model: PreTrainedModel, shape: StudentShape, dtype: torch.dtype) -> dict[str, Tensor]:
    """What ships of a student: its trained tensors in ``dtype``, plus the subset's token ids."""
    state = model.state_dict()
    shipped = {name: state[name].detach().to(dtype).contiguous() for name in trained_names(shape, model)}
    if shape.vocab_subset is not None:
        shipped[SUBSET_IDS] = state[SUBSET_IDS].clone()
    return shipped


def assemble(target: LlamaForCausalLM, shape: StudentShape, shipped: dict[str, Tensor],
             dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """The student: target tensors copied where it shares them, ``shipped`` ones elsewhere, all in ``dtype``."""
    config = student_config(target.config, shape)
    model_class = LlamaForCausalLM if shape.vocab_subset is None else SubsetVocabLlamaForCausalLM
    with torch.random.fork_rng(devices=[]):  # the throw-away initialisation draws from no one's stream
        student = model_class(config)
    source = target.state_dict()
    state: dict[str, Tensor] = {}
    for name in student.state_dict():
        if name in shipped:
            tensor = shipped[name]
        elif name == "lm_head.weight" and shape.vocab_subset is not None:
            tensor = source["model.embed_tokens.weight"][shipped[SUBSET_IDS]]
        elif name == "lm_head.weight":
            continue  # tied to the embeddings
        else:
            tensor = source[name]
        state[name] = tensor.clone() if tensor.dtype == torch.long else tensor.to(dtype).clone()
    missing = set(shipped) - set(state)
    if missing:
        raise ValueError(f"shipped tensors the student does not have: {sorted(missing)}")
    student.load_state_dict(state, assign=True, strict=shape.vocab_subset is not None)
    student.tie_weights()
    student.generation_config = target.generation_config
    return student.eval()
