"""The baseline every speculative method is measured against: the target alone, decoding a batch with HF ``generate``.

Prompts of different lengths are left-padded with an attention mask; each step feeds one token per
row. A row's generated tokens end at its first EOS (HF keeps stepping rows that stopped, padded,
until every row has stopped or the budget is spent), so :attr:`TargetAloneBatch.steps` is what
the batch paid and :attr:`TargetAloneBatch.tokens` what it produced.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from decode.loops.prompt_input import id_list, left_pad, pad_id
from decode.timing import Stopwatch


@dataclass(frozen=True)
class TargetAloneBatch:
    """One batched ``generate`` of the target: ``rows`` prompts, ``steps`` decoding forwards after the prompt's."""

    rows: int
    tokens: int
    steps: int
    wall_time_s: float


@torch.inference_mode()
def generate_target_alone(target: PreTrainedModel, prompts: list[torch.Tensor], max_new_tokens: int,
                          eos: int | list[int] | None, do_sample: bool = True, seed: int = 0,
                          static_cache: bool = False) -> TargetAloneBatch:
    """Decode the 1-D ``prompts`` together with ``target.generate`` (temperature 1 sampling or greedy);
    ``eos`` None: every row decodes ``max_new_tokens``; ``static_cache``: transformers' static cache, eager (no
    compilation)."""
    ids, mask = left_pad(prompts, 0, target.device)
    width = ids.shape[1]
    stops = id_list(eos)
    sampling = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0} if do_sample else {"do_sample": False}
    cache = {"cache_implementation": "static", "disable_compile": True} if static_cache else {}
    torch.manual_seed(seed)
    with Stopwatch(target.device) as watch:
        # Without EOS ids every row decodes the whole budget: eos_token_id=None overrides the generation config's.
        new = target.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, eos_token_id=stops or None,
                              pad_token_id=pad_id(None, stops), **sampling, **cache)[:, width:]
    stop = torch.isin(new, torch.tensor(stops, dtype=torch.long, device=new.device)).long()
    before = (stop.cumsum(1) - stop) == 0  # a row's tokens up to and including its first EOS
    return TargetAloneBatch(rows=len(prompts), tokens=int(before.sum()), steps=max(new.shape[1] - 1, 0),
                            wall_time_s=watch.seconds)
