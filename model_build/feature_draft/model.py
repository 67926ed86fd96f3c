"""A feature draft's starting point on a target: its shape, and its first weights taken from the target.

The draft's layers start as copies of the target's last layers with their residual branches' output projections
at zero, its output layer as the target's embeddings of the subset (the target's most frequent response
tokens), its embeddings are the target's (frozen), and ``fc`` starts by passing the feature through (the token's
embedding enters with weight zero): at step 0 the draft returns the feature it reads, so it starts out predicting
with the target's distribution of one position earlier, and training moves it one position on. An EAGLE-3 first
layer (``first_layer="eagle3"``) starts the same way: its attention reads only the feature, ``fuse`` passes the last
target layer read through, and its output layer normalises with the target's final norm.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import PreTrainedModel

from decode.drafts.feature_model import FeatureDraftConfig, FeatureDraftForCausalLM

#: The draft's own tensors (the rest, its embeddings, are the target's and are never trained or shipped).
TRAINED_PREFIXES = ("fc.", "fuse.", "feature_norms.", "read_norm.", "model.layers.", "model.norm.", "lm_head.")


@dataclass(frozen=True)
class FeatureDraftShape:
    """How a feature draft is built on a target.

    ``feature_layers``: the target's ``hidden_states`` it reads (None: the last one, the output layer's input;
    EAGLE-3 reads a low, a middle and a high layer); ``vocab_subset``: tokens its output layer scores (None:
    all, through the target's tied embeddings); ``head_rank``: that layer's rank (None: full; SlimSpec);
    ``feature_norm``: EAGLE-3.1's norms on every target layer read and on every feature read; ``first_layer``: this
    project's ``fc`` or EAGLE-3's layer as vLLM loads it (:data:`decode.drafts.feature_model.FIRST_LAYERS`).
    """

    layers: int = 1
    feature_layers: tuple[int, ...] | None = None
    vocab_subset: int | None = 8192
    head_rank: int | None = None
    feature_norm: bool = False
    first_layer: str = "fc"

    def reads(self, target: PreTrainedModel) -> tuple[int, ...]:
        """The target's ``hidden_states`` indices it reads (None: the last one; with an EAGLE-3 first layer,
        EAGLE-3's low, middle and high layers, as vLLM picks them)."""
        if self.feature_layers is not None:
            return self.feature_layers
        count = target.config.num_hidden_layers
        if self.first_layer != "eagle3":
            return (count,)
        return tuple(sorted({2, count // 2, count - 3} & set(range(count))))  # vLLM hands them over in this order


def frequent_tokens(sequences: Iterable[Tensor], vocab: int, count: int) -> Tensor:
    """The ``count`` most frequent ids of ``sequences`` (ties to the lower id), sorted by id: a subset head's tokens."""
    counts = torch.zeros(vocab, dtype=torch.long)
    for ids in sequences:
        counts.index_add_(0, ids.long(), torch.ones(len(ids), dtype=torch.long))
    order = sorted(range(vocab), key=lambda token: (-int(counts[token]), token))
    return torch.tensor(sorted(order[:count]), dtype=torch.long)


def draft_config(target: PreTrainedModel, shape: FeatureDraftShape) -> FeatureDraftConfig:
    """The target's config at the draft's depth, with what it reads of the target."""
    dropped = ("architectures", "model_type", "transformers_version", "num_hidden_layers", "tie_word_embeddings",
               "layer_types")
    fields = {k: v for k, v in target.config.to_dict().items() if k not in dropped}
    return FeatureDraftConfig(**fields, num_hidden_layers=shape.layers, feature_layers=list(shape.reads(target)),
                              target_hidden_size=target.config.hidden_size, draft_vocab_size=shape.vocab_subset,
                              draft_head_rank=shape.head_rank, feature_norm=shape.feature_norm,
                              first_layer=shape.first_layer, tie_word_embeddings=shape.vocab_subset is None)


def initial_draft(target: PreTrainedModel, shape: FeatureDraftShape, subset: Tensor | None) -> FeatureDraftForCausalLM:
    """A float32 feature draft starting from the target (see the module docstring); ``subset``: the scored ids."""
    config = draft_config(target, shape)
    with torch.random.fork_rng(devices=[]):  # random initialisation of fuse (if any) only
        torch.manual_seed(0)
        draft = FeatureDraftForCausalLM(config).float()
    source = {k: v.detach().float() for k, v in target.state_dict().items()}
    hidden, count = target.config.hidden_size, target.config.num_hidden_layers
    state = draft.state_dict()
    state["model.embed_tokens.weight"] = source["model.embed_tokens.weight"]
    for index in range(shape.layers):
        origin = f"model.layers.{count - shape.layers + index}."
        for name in [n for n in state if n.startswith(f"model.layers.{index}.")]:
            copied = source.get(origin + name.removeprefix(f"model.layers.{index}."))
            if copied is not None and copied.shape == state[name].shape:  # an EAGLE-3 layer's q/k/v and hidden_norm:
                state[name] = copied                                        # eagle3_start
        for branch in ("self_attn.o_proj.weight", "mlp.down_proj.weight"):  # the layer starts as the identity
            state[f"model.layers.{index}.{branch}"] = torch.zeros_like(state[f"model.layers.{index}.{branch}"])
    if shape.first_layer == "eagle3":
        eagle3_start(state, source, draft.config, count)
    else:  # the features already passed the target's final norm: the draft's keeps their scale, and so does its
        # norm on every feature read (EAGLE-3.1)
        scale = float(source["model.norm.weight"].pow(2).mean().sqrt())
        state["model.norm.weight"] = torch.full((hidden,), scale)
        if shape.feature_norm:
            state["read_norm.weight"] = torch.full((hidden,), scale)
        state["fc.weight"] = torch.cat([torch.zeros(hidden, hidden), torch.eye(hidden)], dim=1)
        state["fc.bias"] = torch.zeros(hidden)
    if shape.vocab_subset is not None:
        if subset is None or len(subset) != shape.vocab_subset:
            raise ValueError(f"a {shape.vocab_subset}-token output layer needs that many subset ids")
        rows = source["model.embed_tokens.weight"][subset]  # [S, H]
        if shape.head_rank is None:
            state["lm_head.weight"] = rows
        else:  # the best rank-r approximation of the same rows: rows ≈ weight @ down
            left, values, right = torch.linalg.svd(rows, full_matrices=False)
            state["lm_head.weight"] = left[:, :shape.head_rank] * values[:shape.head_rank]
            state["lm_head.down.weight"] = right[:shape.head_rank]
        state["lm_head.token_ids"] = subset.clone()
    draft.load_state_dict(state, strict=True)
    draft.model.embed_tokens.weight.requires_grad_(False)
    draft.generation_config = target.generation_config
    return draft


def eagle3_start(state: dict[str, Tensor], source: dict[str, Tensor], config: FeatureDraftConfig, count: int) -> None:
    """An EAGLE-3 first layer's start in ``state`` (the layers already copied from the target's last ones): its
    attention reads the feature alone (the embedding's half of q/k/v at zero, ``hidden_norm`` the copied layer's input
    norm), ``fuse`` passes the last target layer read through, the output layer normalises with the target's final
    norm. At step 0 the draft scores the last layer it reads through the target's output layer (a logit lens)."""
    layer = "model.layers.0."
    for name in ("q_proj", "k_proj", "v_proj"):  # [out, 2H]: the copied [out, H] in the feature's half
        copied = source[f"model.layers.{count - config.num_hidden_layers}.self_attn.{name}.weight"]
        state[f"{layer}self_attn.{name}.weight"] = torch.cat([torch.zeros_like(copied), copied], dim=1)
    state[f"{layer}hidden_norm.weight"] = state[f"{layer}input_layernorm.weight"].clone()
    width = config.target_hidden_size
    fuse = torch.zeros(config.hidden_size, len(config.feature_layers) * width)
    fuse[:, -width:] = torch.eye(config.hidden_size, width)
    state["fuse.weight"] = fuse
    state["lm_head.norm.weight"] = source["model.norm.weight"].clone()


def warm_start(draft: FeatureDraftForCausalLM, trained: dict[str, Tensor]) -> None:
    """Replace ``draft``'s own tensors by ``trained`` (a trained draft's ``trained.safetensors`` of the same shape), to
    continue training from it; a missing tensor or another shape is one ``ValueError`` naming it."""
    state = draft.state_dict()
    own = {name for name in state if name.startswith(TRAINED_PREFIXES)}
    if missing := sorted(own - set(trained)):
        raise ValueError(f"the draft to start from lacks {missing}: it was built with another shape")
    if other := [name for name in own if trained[name].shape != state[name].shape]:
        raise ValueError(f"the draft to start from has other shapes for {sorted(other)}: build with its shape")
    draft.load_state_dict({name: trained[name].to(state[name].dtype) for name in own}, strict=False)


def trained_tensors(draft: FeatureDraftForCausalLM, dtype: torch.dtype) -> dict[str, Tensor]:
    """What ships of a feature draft: its own tensors in ``dtype`` (the subset's ids as they are)."""
    return {name: (t if t.dtype == torch.long else t.to(dtype)).detach().contiguous()
            for name, t in draft.state_dict().items() if name.startswith(TRAINED_PREFIXES)}


def assemble_draft(target: PreTrainedModel, config: FeatureDraftConfig, shipped: dict[str, Tensor],
                   dtype: torch.dtype = torch.float32) -> FeatureDraftForCausalLM:
    """The feature draft: the target's embeddings, ``shipped`` tensors elsewhere, all in ``dtype``."""
    with torch.random.fork_rng(devices=[]):
        draft = FeatureDraftForCausalLM(config)
    state = {name: shipped[name] for name in draft.state_dict() if name in shipped}
    state["model.embed_tokens.weight"] = target.get_input_embeddings().weight.detach()
    tied = {"lm_head.weight"} if config.draft_vocab_size is None else set()
    missing = set(draft.state_dict()) - set(state) - tied
    if missing:
        raise ValueError(f"the shipped tensors lack {sorted(missing)}")
    state = {k: v.clone() if v.dtype == torch.long else v.to(dtype).clone() for k, v in state.items()}
    draft.load_state_dict(state, strict=False, assign=True)
    draft.tie_weights()
    draft.generation_config = target.generation_config
    return draft.to(dtype).eval()
