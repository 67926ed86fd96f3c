"""Batched generation with compiled steps (:class:`decode.compile.batch_steps.BatchSteps`) generates what eager
generation does: float32 micro models, prompts of several lengths, caches grown past a bucket."""

from __future__ import annotations

import pytest
import torch

from data_gen.generation import generate_responses
from decode.compile.batch_steps import BatchSteps
from decode.compile.config import CompileConfig
from decode.loops.prompt_input import left_pad
from decode.sampling import Sampling
from tests.helpers.compiler import needs_compiler
from tests.helpers.micro_models import micro_lm

PROMPTS = [[3, 1, 4], [1, 5, 9, 2, 6, 5, 3], list(range(40, 70))]


def positions(mask: torch.Tensor) -> torch.Tensor:
    return (mask.cumsum(-1) - 1).clamp_min(0)


def greedy_steps(steps: BatchSteps, prompts: list[list[int]], tokens: int) -> torch.Tensor:
    ids, mask = left_pad(prompts, 0, torch.device("cpu"))
    position = mask.sum(-1, keepdim=True)
    logits, out = steps.prefill(ids, mask, positions(mask)), []
    for _ in range(tokens):
        out.append(logits.argmax(-1))
        logits = steps.step(out[-1], position)
        position = position + 1
    return torch.stack(out, dim=1)


@needs_compiler
def test_compiled_steps_grow_their_cache_by_a_bucket_and_decode_as_eager():
    model = micro_lm(96, seed=21, hidden=32, layers=2, init=0.3)
    small = CompileConfig(bucket=16, inductor={"freezing": False})  # 30-token prompt + 40 tokens: three growths
    compiled = BatchSteps(model, compiled=True, config=small)
    with torch.inference_mode():
        got = greedy_steps(compiled, PROMPTS, 40)
        expected = greedy_steps(BatchSteps(model, compiled=False), PROMPTS, 40)
    assert torch.equal(got, expected)
    assert compiled._cache.get_max_length() == 80  # grown 32 -> 48 -> 64 -> 80, a graph each
    assert compiled.log.graphs == 4
    assert len(set(got[0].tolist())) > 1  # negative control: the model does not repeat one token


@needs_compiler
def test_compiled_batched_generation_equals_eager_batched_generation():
    model = micro_lm(96, seed=23, hidden=32, layers=2, init=0.3)

    def generate(compiled: bool):
        generators = [torch.Generator().manual_seed(seed) for seed in range(len(PROMPTS))]
        return generate_responses(model, PROMPTS, sampling=Sampling(), max_new_tokens=24, eos_token_id=None,
                                  pad_token_id=0, generators=generators, vocab=96, compiled=compiled)

    eager, compiled = generate(False), generate(True)
    assert torch.equal(compiled.input_ids, eager.input_ids) and compiled.response_lengths == eager.response_lengths
    torch.testing.assert_close(compiled.target_logits, eager.target_logits, rtol=1e-4, atol=1e-4)


def test_without_a_compiler_batch_steps_run_eager_after_one_line(monkeypatch):
    from decode.compile import owner

    monkeypatch.setattr(owner.shutil, "which", lambda name: None)
    model = micro_lm(96, seed=25, hidden=32, layers=2, init=0.3)
    with pytest.warns(UserWarning, match="no C\\+\\+ compiler") as caught:
        steps = BatchSteps(model, compiled=True)
    assert len(caught) == 1 and not steps.compiled
    with torch.inference_mode():
        assert torch.equal(greedy_steps(steps, PROMPTS, 8), greedy_steps(BatchSteps(model, compiled=False), PROMPTS, 8))
