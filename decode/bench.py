"""Throughput of ``Fixed(k)`` speculative decoding vs HF assisted generation and the target alone.

    python -m decode.bench --target PATH --draft PATH [--k 5] [--prompts N] [--max-new-tokens 128]

Without ``--target/--draft`` the built-in model zoo (``data_gen.zoo``) is used. Every method
decodes the same prompts at temperature 1 (no top-k / top-p) with the same constant K; model
calls are counted with forward hooks.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedModel

from decode.decoder import SpeculativeDecoder
from decode.hub import ModelLoadError, load_causal_lm, load_tokenizer
from decode.policies import Fixed
from decode.rules import Speculative
from decode.sampling import Sampling

TEXT_PROMPTS = [
    "def fibonacci(n):\n",
    "import os\nimport sys\n\n\ndef main(",
    "class Stack:\n    def __init__(self):\n",
    "# Parse the command line arguments\n",
    "for i in range(10):\n",
    "def read_config(path):\n    \"\"\"",
    "try:\n    import json\nexcept ImportError:\n",
    "    def __repr__(self):\n        return ",
]


@dataclass
class Result:
    """Totals of one method over all prompts."""

    name: str
    tokens: int = 0
    seconds: float = 0.0
    target_calls: int = 0
    draft_calls: int = 0

    def row(self, baseline: float | None) -> str:
        rate = self.tokens / self.seconds if self.seconds else 0.0
        ratio = f"{rate / baseline:6.2f}x" if baseline else "      -"
        per = max(self.tokens, 1)
        return (
            f"{self.name:<28} {rate:10.1f} {ratio:>8} {self.target_calls / per:10.3f} "
            f"{self.draft_calls / per:10.3f} {self.tokens:8d} {self.seconds:9.2f}"
        )


class CallCounter:
    """Counts forward calls of a module via a forward hook."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.calls = 0
        self._handle = model.register_forward_hook(self._hook)

    def _hook(self, *args: object) -> None:
        self.calls += 1

    def remove(self) -> None:
        self._handle.remove()


def make_prompts(path: str, count: int, vocab: int, device: torch.device) -> list[torch.Tensor]:
    """Tokenised built-in text prompts when ``path`` has a tokenizer, else seeded random token ids."""
    try:
        tokenizer = load_tokenizer(path)
    except ModelLoadError:
        generator = torch.Generator().manual_seed(0)
        return [torch.randint(0, vocab, (1, 16), generator=generator).to(device) for _ in range(count)]
    texts = [TEXT_PROMPTS[i % len(TEXT_PROMPTS)] for i in range(count)]
    return [tokenizer(text, return_tensors="pt").input_ids.to(device) for text in texts]


def measure(
    name: str, run: Callable[[torch.Tensor, int], torch.Tensor], prompts: list[torch.Tensor],
    target: PreTrainedModel, draft: PreTrainedModel,
) -> Result:
    """Time ``run(prompt, seed) -> sequences`` over all prompts (after one warm-up call)."""
    run(prompts[0], 0)
    result = Result(name)
    counters = CallCounter(target), CallCounter(draft)
    try:
        for seed, prompt in enumerate(prompts):
            if prompt.is_cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            sequences = run(prompt, seed)
            if prompt.is_cuda:
                torch.cuda.synchronize()
            result.seconds += time.perf_counter() - start
            result.tokens += sequences.shape[1] - prompt.shape[1]
    finally:
        for counter in counters:
            counter.remove()
    result.target_calls, result.draft_calls = counters[0].calls, counters[1].calls
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m decode.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", help="target model (hub id or directory); default: the zoo's target")
    parser.add_argument("--draft", help="draft model (hub id or directory); default: the zoo's draft")
    parser.add_argument("--k", type=int, default=5, help="constant number of draft tokens per round")
    parser.add_argument("--prompts", type=int, default=8, help="number of prompts")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="auto", help="auto, float32, bfloat16, float16")
    parser.add_argument("--stop-at-eos", action="store_true", help="stop at EOS (default: always decode the budget)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> list[Result]:
    """Run the benchmark and print the table; returns the per-method results."""
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.target is None or args.draft is None:
        from data_gen.zoo import ensure_zoo  # lazy: decode itself never depends on data_gen

        zoo = ensure_zoo()
        args.target = args.target or str(zoo.path("target"))
        args.draft = args.draft or str(zoo.path("draft"))
    device = torch.device(args.device)
    target = load_causal_lm(args.target, dtype=args.dtype).to(device)
    draft = load_causal_lm(args.draft, dtype=args.dtype).to(device)
    prompts = make_prompts(args.target, args.prompts, target.config.get_text_config().vocab_size, device)
    budget = args.max_new_tokens
    eos = target.generation_config.eos_token_id if args.stop_at_eos else None
    common = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "max_new_tokens": budget}
    if not args.stop_at_eos:
        common["min_new_tokens"] = budget
    if target.generation_config.pad_token_id is None:
        common["pad_token_id"] = eos if isinstance(eos, int) else 0
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.num_assistant_tokens = args.k
    draft.generation_config.assistant_confidence_threshold = 0.0
    decoder = SpeculativeDecoder(target, draft, rule=Speculative(), policy=Fixed(args.k), sampling=Sampling(), eos_token_id=eos)

    def hf_generate(assistant: PreTrainedModel | None) -> Callable[[torch.Tensor, int], torch.Tensor]:
        def run(prompt: torch.Tensor, seed: int) -> torch.Tensor:
            torch.manual_seed(seed)
            with torch.inference_mode():
                return target.generate(
                    prompt, attention_mask=torch.ones_like(prompt), assistant_model=assistant, **common
                )

        return run

    def ours(prompt: torch.Tensor, seed: int) -> torch.Tensor:
        return decoder.generate(prompt, max_new_tokens=budget, seed=seed).sequences

    results = [
        measure("target alone (HF generate)", hf_generate(None), prompts, target, draft),
        measure(f"HF assisted, constant K={args.k}", hf_generate(draft), prompts, target, draft),
        measure(f"decode Fixed({args.k})", ours, prompts, target, draft),
    ]
    print(f"target={Path(args.target).name} draft={Path(args.draft).name} device={device} "
          f"prompts={len(prompts)} max_new_tokens={budget} K={args.k}")
    print(f"{'method':<28} {'tokens/s':>10} {'vs target':>8} {'tgt/token':>10} {'drf/token':>10} {'tokens':>8} {'seconds':>9}")
    baseline = results[0].tokens / results[0].seconds if results[0].seconds else None
    for result in results:
        print(result.row(baseline))
    hf, ours_result = results[1], results[2]
    if hf.seconds and ours_result.seconds:
        speedup = (ours_result.tokens / ours_result.seconds) / (hf.tokens / hf.seconds)
        print(f"decode Fixed({args.k}) / HF assisted tokens/s: {speedup:.2f}x")
    return results


if __name__ == "__main__":
    main()
