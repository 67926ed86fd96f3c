"""Our decoder behind transformers' own ``generate``: the ``custom_generate`` door (docs/library.md).

``target.generate(**inputs, custom_generate=speculative_generate, draft_model=draft, head=head)``
lets ``generate`` prepare what it always prepares (generation config, logits processors, stopping
criteria, padded inputs) and then decodes with :class:`~decode.loops.speculative_decoder.SpeculativeDecoder`
under a rule and a length policy:

- ``do_sample`` / ``temperature`` / ``top_k`` / ``top_p`` become the :class:`~decode.sampling.Sampling`
  applied to target and draft alike (lossless); any other logits processor is refused in one line,
  since applying it to the target alone would change the distribution the draft is checked against;
- ``max_new_tokens`` and EOS are the decoder's own budget and stop; any other stopping criterion
  is checked whenever tokens become final, once per round, as HF's assisted generation does;
- ``return_dict_in_generate=True`` gives a :class:`SpeculativeGenerateOutput` with per-row stats;
- a padded ``[B, n]`` batch with its ``attention_mask`` decodes in the batched loop; row ``i`` is
  seeded with ``row_seed(seed, i)``, ``seed`` drawn from torch's global generator unless given.

transformers hands a callable ``custom_generate`` only the keywords its signature adds to those of
``GenerationMixin._sample``: ``assistant_model=`` and ``streamer=``, which are ``generate``'s own
parameters, never reach it. So the draft comes as ``draft_model=`` and a streamer is bound to the
callable (``functools.partial(speculative_generate, streamer=streamer)``). The string door — a
head repo or folder with ``custom_generate/generate.py`` (:mod:`decode.artifacts.custom_generate`,
written by ``accept_heads.push_head``) — receives every argument, so there ``assistant_model=`` and
``streamer=`` work as for HF assisted generation, and the head is loaded from the same repo.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from transformers import GenerationConfig, GenerationMixin, PreTrainedModel
from transformers.generation import GenerateDecoderOnlyOutput
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

from decode.artifacts.serialization import load_head, load_profile
from decode.head import AcceptanceHead
from decode.loops.batched import BatchDecodeOutput
from decode.loops.emit import OnTokens
from decode.loops.prompt_input import id_list
from decode.loops.speculative_decoder import SpeculativeDecoder
from decode.policies.base import Policy, PolicyInputs
from decode.policies.stop_policy import Head
from decode.policy_specs import SVSpec
from decode.profile import SVProfile
from decode.rules import Greedy, Rule, Speculative
from decode.sampling import Sampling
from decode.stats import DecodeStats

#: ``generate``'s model kwargs the decoder replaces with its own (its caches, positions and masks).
_PREPARED = frozenset({"attention_mask", "cache", "past_key_values", "use_cache", "logits_to_keep", "position_ids"})
#: Outputs of HF's decoding loops the decoder does not produce.
_OUTPUTS = ("output_scores", "output_logits", "output_attentions", "output_hidden_states")


@dataclass
class SpeculativeGenerateOutput(GenerateDecoderOnlyOutput):
    """``generate``'s output with ``return_dict_in_generate=True``; ``stats[i]``: row ``i``'s counts."""

    stats: list[DecodeStats] | None = None


def sampling_from(generation_config: GenerationConfig, processors: LogitsProcessorList) -> Sampling:
    """The :class:`Sampling` of ``generate``'s prepared processors (greedy without ``do_sample``).

    Raises ``ValueError`` for a processor that cannot be applied to target and draft alike.
    """
    settings: dict[str, Any] = {}
    for processor in processors:
        if isinstance(processor, TemperatureLogitsWarper):
            settings["temperature"] = float(processor.temperature)
        elif isinstance(processor, TopKLogitsWarper):
            settings["top_k"] = int(processor.top_k)
        elif isinstance(processor, TopPLogitsWarper):
            settings["top_p"] = float(processor.top_p)
        else:
            raise ValueError(
                f"speculative_generate applies temperature, top_k and top_p to target and draft alike; "
                f"{type(processor).__name__} would change the target's distribution alone and break losslessness: "
                "drop the generate() argument that adds it"
            )
    if not generation_config.do_sample:
        return Sampling(temperature=0.0)
    return Sampling(**settings)


def _rule(rule: Rule | None, head: AcceptanceHead | None, profile: SVProfile | None, sampling: Sampling) -> Rule:
    """The given rule, else the artifact's, else greedy for greedy decoding and speculative sampling otherwise."""
    if rule is not None:
        return rule
    artifact = head if head is not None else profile
    if artifact is not None and artifact.metadata is not None:
        return artifact.metadata.build_rule()
    return Greedy() if sampling.greedy else Speculative()


def _policy(policy: Policy | None, head: AcceptanceHead | None, profile: SVProfile | None) -> Policy | None:
    """The given policy, else the artifact's own stop (the head at the ``h`` the evaluation chose for it and the K range
    it records, :class:`decode.policies.Head`; the profile as its spec builds it); None: the decoder's default."""
    if policy is not None:
        return policy
    if head is not None:
        return Head(head)
    if profile is not None:
        return SVSpec("profile").build(PolicyInputs(profiles={"profile": profile}))
    return None


def _check_arguments(generation_config: GenerationConfig, model_kwargs: dict[str, Any], synced_gpus: bool) -> None:
    """Refuse, in one line, what the decoder cannot honour."""
    asked = [name for name in _OUTPUTS if getattr(generation_config, name, False)]
    if asked:
        raise ValueError(f"speculative_generate returns sequences and per-row stats, not {', '.join(asked)}")
    if (generation_config.num_beams or 1) > 1 or (generation_config.num_return_sequences or 1) > 1:
        raise ValueError("speculative_generate decodes one sequence per prompt: num_beams=1, num_return_sequences=1")
    if synced_gpus:
        raise ValueError("speculative_generate does not support synced_gpus")
    extra = sorted(key for key, value in model_kwargs.items() if key not in _PREPARED and value is not None)
    if extra:
        raise ValueError(f"speculative_generate decodes text-only causal LMs from input_ids; got {', '.join(extra)}")
    cache = model_kwargs.get("cache", model_kwargs.get("past_key_values"))
    if cache is not None and cache.get_seq_length() > 0:
        raise ValueError("speculative_generate builds its own caches: pass the whole prompt, not a filled cache")


def _observer(stopping_criteria: StoppingCriteriaList, streamer: BaseStreamer | None) -> OnTokens | None:
    """The decoder's ``on_tokens``: stream the new tokens, and apply the stopping criteria the decoder
    does not apply itself (the length budget and EOS are its own)."""
    criteria = [c for c in stopping_criteria if not isinstance(c, (MaxLengthCriteria, EosTokenCriteria))]
    if not criteria and streamer is None:
        return None

    def on_tokens(row: int, sequence: Tensor, start: int) -> bool:
        if streamer is not None:
            streamer.put(sequence[start:].cpu())
        return any(bool(criterion(sequence[None], None).any()) for criterion in criteria)

    return on_tokens


def _padded(input_ids: Tensor, generated: list[Tensor], pad: int) -> Tensor:
    """``[B, n + longest]``: the inputs as given, each row's generated tokens after them, then ``pad``."""
    width = max((len(g) for g in generated), default=0)
    out = torch.full((input_ids.shape[0], input_ids.shape[1] + width), pad, dtype=torch.long,
                     device=input_ids.device)
    out[:, : input_ids.shape[1]] = input_ids
    for i, tokens in enumerate(generated):
        out[i, input_ids.shape[1] : input_ids.shape[1] + len(tokens)] = tokens
    return out


def speculative_generate(
    model: PreTrainedModel,
    input_ids: Tensor,
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    generation_config: GenerationConfig,
    synced_gpus: bool = False,
    streamer: BaseStreamer | None = None,
    *,
    draft_model: PreTrainedModel | None = None,
    head: AcceptanceHead | None = None,
    profile: SVProfile | None = None,
    policy: Policy | None = None,
    rule: Rule | None = None,
    companion_model: PreTrainedModel | None = None,
    seed: int | None = None,
    **model_kwargs: Any,
) -> Tensor | SpeculativeGenerateOutput:
    """The decoding loop ``generate(custom_generate=speculative_generate, draft_model=..., ...)`` runs (module doc).

    ``head`` (a SpecDec++ threshold stop at the ``h`` the evaluation chose for it) or ``profile`` (SV, with
    ``companion_model``) or any ``policy``; ``rule`` defaults to the artifact's, else greedy under
    greedy decoding and speculative sampling otherwise.
    """
    if draft_model is None:
        raise ValueError("speculative_generate needs the draft: pass draft_model=draft to generate() (transformers "
                         "does not hand assistant_model to a callable custom_generate)")
    _check_arguments(generation_config, model_kwargs, synced_gpus)
    sampling = sampling_from(generation_config, logits_processor)
    chosen = _policy(policy, head, profile)
    decoder = SpeculativeDecoder(model, draft_model, rule=_rule(rule, head, profile, sampling),
                                 policy=chosen, companion=companion_model, sampling=sampling,
                                 eos_token_id=id_list(generation_config.eos_token_id) or None)
    batch, length = input_ids.shape
    if streamer is not None and batch > 1:
        raise ValueError(f"a streamer takes one sequence; got a batch of {batch}: stream at batch size 1")
    max_new_tokens = max(generation_config.max_length - length, 0)
    seed = int(torch.randint(0, 2**62, (1,)).item()) if seed is None else seed
    on_tokens = _observer(stopping_criteria, streamer)
    if streamer is not None:
        streamer.put(input_ids.cpu())
    mask = model_kwargs.get("attention_mask")
    if batch == 1 and (mask is None or bool(mask.all())):
        out = decoder.generate(input_ids, max_new_tokens=max_new_tokens, seed=seed, on_tokens=on_tokens)
        generated, stats = [out.sequences[0, length:]], [out.stats]
    else:
        mask = torch.ones_like(input_ids) if mask is None else mask
        batched: BatchDecodeOutput = decoder.generate(input_ids, max_new_tokens=max_new_tokens, seed=seed,
                                                      attention_mask=mask, on_tokens=on_tokens)
        generated = [seq[n:] for seq, n in zip(batched.sequences, batched.prompt_lengths)]
        stats = batched.stats
    if streamer is not None:
        streamer.end()
    pad = generation_config.pad_token_id
    sequences = _padded(input_ids, generated, pad if pad is not None else 0)
    if generation_config.return_dict_in_generate:
        return SpeculativeGenerateOutput(sequences=sequences, stats=stats)
    return sequences


@functools.cache
def _artifact(source: str, revision: str | None, kind: str, filename: str) -> AcceptanceHead | SVProfile:
    """A repo's head or SV profile, loaded once per process."""
    if kind == "head":
        return load_head(source, revision=revision, filename=filename)
    return load_profile(source, revision=revision, filename=filename)


def generate_from_repo(model: PreTrainedModel, source: str, revision: str | None, kind: str, filename: str,
                       inputs: Tensor | None = None, *, assistant_model: PreTrainedModel | None = None,
                       streamer: BaseStreamer | None = None, **arguments: Any) -> Tensor | SpeculativeGenerateOutput:
    """What a head repo's ``custom_generate/generate.py`` runs: ``generate`` with :func:`speculative_generate`,
    the repo's head (or SV profile) as the policy unless ``head`` / ``profile`` / ``policy`` is given, and
    ``assistant_model`` as the draft."""
    arguments.setdefault("draft_model", assistant_model)
    if arguments["draft_model"] is None:
        raise ValueError(f"{source}: pass the draft as generate(..., assistant_model=draft)")
    if not any(arguments.get(key) is not None for key in ("head", "profile", "policy")):
        arguments[kind if kind == "head" else "profile"] = _artifact(source, revision, kind, filename)
    loop = functools.partial(speculative_generate, streamer=streamer)
    return GenerationMixin.generate(model, inputs, custom_generate=loop, **arguments)
