"""Throughput of ``Fixed(k)`` speculative decoding vs HF assisted generation and the target alone.

    python -m benchmarks.decoding [--target PATH --draft PATH | --random-init {tiny,1b}] [--k 5]
                           [--prompts N] [--max-new-tokens 128] [--dtype bfloat16] [--breakdown] [--compile]
                           [--runs 3]
                           [--batch-sizes 1 8 32 [--layouts compact holes] [--head PATH [--threshold H]]
                                                 [--goodput [--k-grid 1 2 4 8] [--profile PATH]]]

Without ``--target/--draft`` the built-in model zoo is loaded from its cache directory
(:mod:`model_build.zoo.paths`; install it first with ``python -m model_build.zoo``); ``--random-init``
builds a seeded random Llama pair in code instead (no files). Every method decodes the same
prompts at temperature 1 (no top-k / top-p) with the same constant K, the methods taking turns
on each prompt; model calls are counted with forward hooks. ``--breakdown`` then decodes the
prompts once more and reports where the time goes: target and draft forwards, and for our
decoder the draft sampling (``Rule.propose``) and verification (``Rule.verify``), each bracketed
by ``torch.cuda.synchronize()`` on CUDA. ``--compile`` adds our loop with compiled forwards
(:mod:`decode.compile`; CUDA graphs on CUDA), the target alone and ``Fixed(k)``, compiled in their
untimed warm-up; their calls are the decoder's own counts (a compiled graph runs no forward hooks), and the
breakdown leaves them out (its brackets are forward hooks too). ``--runs N`` measures N times in turn in one
process (after one compile) and ends with the median and spread of each of our rates over HF assisted's.

``--batch-sizes`` instead compares batched decoding at each batch size ``B`` on ``B`` prompts of
different lengths: the target alone (HF ``generate`` on the left-padded batch) against
``SpeculativeDecoder.generate`` on the list with ``Fixed(k)`` (once per cache layout of ``--layouts``)
and, with ``--head``, with a trained SpecDec++ head, and ``Fixed(k)`` decoding the rows one by
one with ``generate``; calls are (batched) forwards. With ``--goodput`` it compares modelled goodput
at costs measured on the device instead (:mod:`benchmarks.goodput`).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel

from accept_heads.measure.specs import HFConstantSpec
from ahconf.entry import quiet_library_output
from ahconf.schema import ModelSpec
from benchmarks import engines
from benchmarks.devices import add_device_option
from benchmarks.goodput import GoodputRow, run_goodput
from decode.artifacts.hub import ModelLoadError, load_causal_lm, load_tokenizer, resolve_dtype
from decode.artifacts.serialization import load_head
from decode.loops.batch_cache import LAYOUTS
from decode.loops.batched import row_seed
from decode.loops.prompt_input import pad_id
from decode.loops.speculative_decoder import DecodeOutput, SpeculativeDecoder
from decode.loops.target_alone import generate_target_alone
from decode.policies.base import Policy
from decode.policies.schedules import Fixed, TargetOnly
from decode.policies.stop_policy import Head
from decode.rules import Rule, Speculative
from decode.sampling import Sampling
from decode.stats import CallCounter
from decode.threads import torch_threads
from decode.timing import Stopwatch, synchronize
from model_build.zoo.paths import installed_zoo_dir
from runtime.models import resolve_model_id

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

# --random-init pairs: (vocab, target (layers, hidden, heads, intermediate), draft (...)).
RANDOM_PAIRS: dict[str, tuple[int, tuple[int, int, int, int], tuple[int, int, int, int]]] = {
    "tiny": (512, (4, 256, 4, 688), (2, 128, 2, 344)),  # the zoo's target / draft shapes (v3)
    "1b": (32000, (16, 2048, 32, 5632), (6, 768, 12, 2048)),  # ~0.95B target, ~92M draft
}


@dataclass
class Result:
    """Totals of one method over all prompts."""

    name: str
    tokens: int = 0
    seconds: float = 0.0
    target_calls: int = 0
    draft_calls: int = 0

    @property
    def rate(self) -> float:
        """Tokens per second."""
        return self.tokens / self.seconds if self.seconds else 0.0

    def ratio(self, baseline: float | None) -> str:
        """This rate over ``baseline``'s, formatted (``-`` without a baseline)."""
        return f"{self.rate / baseline:6.2f}x" if baseline else "      -"

    def row(self, baseline: float | None) -> str:
        per = max(self.tokens, 1)
        return (
            f"{self.name:<28} {self.rate:10.1f} {self.ratio(baseline):>8} {self.target_calls / per:10.3f} "
            f"{self.draft_calls / per:10.3f} {self.tokens:8d} {self.seconds:9.2f}"
        )


@dataclass
class Breakdown:
    """Seconds per phase of one method over all prompts; ``rounds`` is its number of target calls."""

    name: str
    phases: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    tokens: int = 0
    rounds: int = 0

    def rows(self) -> list[tuple[str, float]]:
        """``(phase, seconds)`` with the unattributed rest as ``other``, then ``total``."""
        rest = self.seconds - sum(self.phases.values())
        return [*self.phases.items(), ("other (bookkeeping, rollback, host syncs)", rest), ("total", self.seconds)]


class PhaseTimer:
    """Accumulates wall time of module forwards and of methods, each bracketed by a device sync.

    Synchronising before and after a phase charges it exactly the device work it queued; the
    syncs slow the run down, so profiled totals exceed unprofiled ones.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._undo: list[Callable[[], None]] = []

    def now(self) -> float:
        """``perf_counter`` after the device has finished its queued work."""
        synchronize(self.device)
        return time.perf_counter()

    def _add(self, label: str, seconds: float) -> None:
        self.seconds[label] = self.seconds.get(label, 0.0) + seconds
        self.calls[label] = self.calls.get(label, 0) + 1

    def module(self, label: str, module: torch.nn.Module) -> None:
        """Time every forward of ``module`` as ``label``."""
        starts: list[float] = []

        def before(*args: object) -> None:
            starts.append(self.now())

        def after(*args: object) -> None:
            self._add(label, self.now() - starts.pop())

        self.seconds.setdefault(label, 0.0)
        handles = module.register_forward_pre_hook(before), module.register_forward_hook(after)
        self._undo.extend(handle.remove for handle in handles)

    def method(self, label: str, owner: object, name: str) -> None:
        """Time every call of ``owner.name`` as ``label`` (an instance attribute shadows the method)."""
        method, shadowed = getattr(owner, name), name in vars(owner)

        def timed(*args: object, **kwargs: object) -> object:
            start = self.now()
            try:
                return method(*args, **kwargs)
            finally:
                self._add(label, self.now() - start)

        self.seconds.setdefault(label, 0.0)
        setattr(owner, name, timed)
        self._undo.append(lambda: setattr(owner, name, method) if shadowed else delattr(owner, name))

    def close(self) -> None:
        """Remove every hook and wrapper."""
        while self._undo:
            self._undo.pop()()


def random_pair(
    size: str, device: torch.device, dtype: torch.dtype, seed: int = 0
) -> tuple[PreTrainedModel, PreTrainedModel]:
    """A seeded random-init Llama target / draft pair of :data:`RANDOM_PAIRS` ``size``, built on ``device``."""
    vocab, *shapes = RANDOM_PAIRS[size]
    models = []
    for offset, (layers, hidden, heads, intermediate) in enumerate(shapes):
        config = LlamaConfig(
            vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
            num_key_value_heads=heads, intermediate_size=intermediate, max_position_embeddings=4096,
        )
        torch.manual_seed(seed + offset)
        with device:
            models.append(LlamaForCausalLM(config).to(dtype).eval())
    return models[0], models[1]


def make_prompts(path: str | None, count: int, vocab: int, device: torch.device) -> list[torch.Tensor]:
    """Tokenised built-in text prompts when ``path`` has a tokenizer, else seeded random token ids."""
    tokenizer = None
    if path is not None:
        try:
            tokenizer = load_tokenizer(path)
        except ModelLoadError:
            tokenizer = None
    if tokenizer is None:
        generator = torch.Generator().manual_seed(0)
        return [torch.randint(0, vocab, (1, 16), generator=generator).to(device) for _ in range(count)]
    texts = [TEXT_PROMPTS[i % len(TEXT_PROMPTS)] for i in range(count)]
    return [tokenizer(text, return_tensors="pt").input_ids.to(device) for text in texts]


# (prompt [1, n], seed) -> the sequences [1, n + new], or our decoder's output (then its own call counts are used)
Run = Callable[[torch.Tensor, int], torch.Tensor | DecodeOutput]


def measure(
    methods: list[tuple[str, Run]], prompts: list[torch.Tensor], target: PreTrainedModel, draft: PreTrainedModel
) -> list[Result]:
    """Time each ``run(prompt, seed)`` over all prompts (after one warm-up call each).

    The methods take turns on every prompt, so a drift of the machine's speed hits them alike. Calls are counted by
    forward hooks, or taken from the decoder's stats where ``run`` returns a :class:`DecodeOutput`.
    """
    for _, run in methods:
        run(prompts[0], 0)
    results = [Result(name) for name, _ in methods]
    counters = CallCounter(target), CallCounter(draft)
    try:
        for seed, prompt in enumerate(prompts):
            for result, (_, run) in zip(results, methods):
                calls = counters[0].calls, counters[1].calls
                with Stopwatch(prompt.device) as clock:
                    out = run(prompt, seed)
                result.seconds += clock.seconds
                own = out.stats if isinstance(out, DecodeOutput) else None
                sequences = out.sequences if own is not None else out
                result.tokens += sequences.shape[1] - prompt.shape[1]
                result.target_calls += own.target_calls if own else counters[0].calls - calls[0]
                result.draft_calls += own.draft_calls if own else counters[1].calls - calls[1]
    finally:
        for counter in counters:
            counter.remove()
    return results


def breakdown(
    name: str, run: Run, prompts: list[torch.Tensor],
    target: PreTrainedModel, draft: PreTrainedModel, rule: Rule | None = None, head: torch.nn.Module | None = None,
) -> Breakdown:
    """Decode the prompts once more with every forward (the head's too) and ``rule``'s propose / verify timed."""
    timer = PhaseTimer(prompts[0].device)
    timer.module("target forward", target)
    timer.module("draft forward", draft)
    if head is not None:
        timer.module("acceptance head", head)
    if rule is not None:
        timer.method("draft sampling (Rule.propose)", rule, "propose")
        timer.method("verification (Rule.verify)", rule, "verify")
    result = Breakdown(name)
    try:
        for seed, prompt in enumerate(prompts):
            start = timer.now()
            sequences = run(prompt, seed)
            result.seconds += timer.now() - start
            result.tokens += sequences.shape[1] - prompt.shape[1]
    finally:
        timer.close()
    result.phases = timer.seconds
    result.rounds = timer.calls.get("target forward", 0)
    return result


def print_breakdown(results: list[Breakdown]) -> None:
    """One table per method: milliseconds per round (target call) and per token, and the share."""
    print("\nwhere the time goes (phases bracketed by torch.cuda.synchronize() on CUDA; one round = one target call)")
    for result in results:
        rounds, tokens = max(result.rounds, 1), max(result.tokens, 1)
        print(f"{result.name}: {result.rounds} rounds, {result.tokens / rounds:.2f} tokens/round, "
              f"{result.tokens / result.seconds if result.seconds else 0.0:.1f} tokens/s profiled")
        print(f"  {'phase':<44} {'ms/round':>9} {'ms/token':>9} {'share':>6}")
        for phase, seconds in result.rows():
            share = seconds / result.seconds if result.seconds else 0.0
            print(f"  {phase:<44} {1e3 * seconds / rounds:9.3f} {1e3 * seconds / tokens:9.3f} {share:6.1%}")


@dataclass
class BatchResult(Result):
    """One method at one batch size: generated tokens of all rows and batched forwards."""

    batch: int = 1

    def row(self, baseline: float | None) -> str:
        return (
            f"{self.name:<34} {self.batch:5d} {self.rate:10.1f} {self.ratio(baseline):>8} {self.target_calls:8d} "
            f"{self.draft_calls:8d} {self.tokens:8d} {self.seconds:9.2f}"
        )


def batch_prompts(path: str | None, count: int, vocab: int, device: torch.device) -> list[torch.Tensor]:
    """``count`` 1-D prompts of different lengths: the text prompts, or seeded random ids of 4..19 tokens."""
    prompts = [prompt[0] for prompt in make_prompts(path, count, vocab, device)]
    return [prompt[: 4 + (7 * i) % 16] for i, prompt in enumerate(prompts)]


BatchRun = Callable[[list[torch.Tensor], int], int]


def hf_batch(target: PreTrainedModel, budget: int, eos: int | list[int] | None) -> BatchRun:
    """The target alone: HF ``generate`` on the left-padded batch (:mod:`decode.loops.target_alone`); returns the
    generated tokens (to EOS)."""

    def run(prompts: list[torch.Tensor], seed: int) -> int:
        return generate_target_alone(target, prompts, budget, eos, seed=seed).tokens

    return run


def ours_batch(decoder: SpeculativeDecoder, budget: int, layout: str) -> BatchRun:
    def run(prompts: list[torch.Tensor], seed: int) -> int:
        return decoder.generate(prompts, max_new_tokens=budget, seed=seed, layout=layout).totals.tokens

    return run


def sequential(decoder: SpeculativeDecoder, budget: int) -> BatchRun:
    """The rows decoded one after the other with batch-1 ``generate`` (row seeds as in the batch)."""

    def run(prompts: list[torch.Tensor], seed: int) -> int:
        return sum(
            decoder.generate(prompt, max_new_tokens=budget, seed=row_seed(seed, i)).stats.generated
            for i, prompt in enumerate(prompts)
        )

    return run


def measure_batched(
    methods: list[tuple[str, BatchRun]], sizes: list[int], prompts: list[torch.Tensor],
    target: PreTrainedModel, draft: PreTrainedModel,
) -> list[BatchResult]:
    """Time every method on the first ``B`` prompts for each ``B`` in ``sizes`` (one warm-up call each).

    Methods take turns at each batch size, so a drift of the machine's speed hits them alike.
    """
    for _, run in methods:
        run(prompts[:1], 0)
    results = []
    counters = CallCounter(target), CallCounter(draft)
    try:
        for batch in sizes:
            for name, run in methods:
                result = BatchResult(name, batch=batch)
                calls = counters[0].calls, counters[1].calls
                with Stopwatch(prompts[0].device) as clock:
                    result.tokens = run(prompts[:batch], batch)
                result.seconds = clock.seconds
                result.target_calls = counters[0].calls - calls[0]
                result.draft_calls = counters[1].calls - calls[1]
                results.append(result)
    finally:
        for counter in counters:
            counter.remove()
    return results


def run_batched(
    args: argparse.Namespace, target: PreTrainedModel, draft: PreTrainedModel,
    eos: int | list[int] | None, device: torch.device,
) -> list[BatchResult]:
    """The ``--batch-sizes`` comparison; prints one table and returns its rows."""
    sizes = args.batch_sizes
    prompts = batch_prompts(args.target, max(sizes), target.config.get_text_config().vocab_size, device)
    budget = args.max_new_tokens
    policies: list[tuple[str, Policy]] = [(f"Fixed({args.k})", Fixed(args.k))]
    if args.head:
        head = load_head(args.head, draft=draft, sampling=Sampling(), rule=Speculative())
        at_h = Head(head, threshold=args.threshold)
        policies.append((f"Head(h={at_h.threshold})", at_h))
    methods: list[tuple[str, BatchRun]] = [("target alone (HF generate)", hf_batch(target, budget, eos))]
    for label, policy in policies:
        decoder = SpeculativeDecoder(target, draft, rule=Speculative(), policy=policy, sampling=Sampling(),
                                     eos_token_id=eos)
        for layout in args.layouts:
            suffix = f" [{layout}]" if len(args.layouts) > 1 else ""
            methods.append((f"decode {label} batched{suffix}", ours_batch(decoder, budget, layout)))
    one_by_one = SpeculativeDecoder(target, draft, rule=Speculative(), policy=Fixed(args.k), sampling=Sampling(),
                                    eos_token_id=eos)
    methods.append((f"decode Fixed({args.k}) one by one", sequential(one_by_one, budget)))
    results = measure_batched(methods, sizes, prompts, target, draft)
    lengths = [len(p) for p in prompts]
    print(f"batched: prompts of {min(lengths)}..{max(lengths)} tokens, max_new_tokens={budget}, "
          f"calls = batched forwards")
    print(f"{'method':<34} {'B':>5} {'tokens/s':>10} {'vs target':>8} {'tgt fwd':>8} {'drf fwd':>8} "
          f"{'tokens':>8} {'seconds':>9}")
    for batch in sizes:
        rows = [r for r in results if r.batch == batch]
        baseline = rows[0].tokens / rows[0].seconds if rows[0].seconds else None
        for result in rows:
            print(result.row(baseline))
    return results


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.decoding", description=__doc__.split("\n\n")[0]
    )
    models = parser.add_mutually_exclusive_group()
    models.add_argument("--target", help="target model (hub id, directory, .gguf file, zoo:<role> or "
                        "real:<pair>/<role>, e.g. real:smollm2/target); default: the zoo's target")
    parser.add_argument("--draft", help="draft model (as --target); default: the zoo's draft")
    models.add_argument(
        "--random-init", choices=sorted(RANDOM_PAIRS),
        help="seeded random-init Llama pair built in code: tiny = the zoo's shapes (vocab 512, target 4x256, "
        "draft 2x128); 1b = vocab 32000, target 16 layers x 2048 (32 heads, MLP 5632, ~0.95B), "
        "draft 6 layers x 768 (12 heads, MLP 2048, ~92M); prompts are random token ids",
    )
    parser.add_argument("--k", type=int, default=5, help="constant number of draft tokens per round (default 5)")
    parser.add_argument("--prompts", type=int, default=8, help="number of prompts (default 8)")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="tokens per prompt (default 128)")
    add_device_option(parser)
    parser.add_argument(
        "--dtype", default="auto",
        help="auto (default: the checkpoint's dtype; float32 for --random-init), float32, bfloat16, float16",
    )
    parser.add_argument("--stop-at-eos", action="store_true", help="stop at EOS (default: always decode the budget)")
    parser.add_argument("--runs", type=int, default=1,
                        help="measure this many times in turn in this process (a table each, then the median and "
                        "spread of our / HF assisted; default 1)")
    parser.add_argument("--compile", action="store_true",
                        help="also time our loop with compiled forwards (CUDA graphs on CUDA): the target alone and "
                        "Fixed(K); each compiles in its untimed warm-up")
    parser.add_argument(
        "--breakdown", action="store_true",
        help="then decode the prompts once more with every phase timed and print where each method's time goes",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument(
        "--batch-sizes", type=int, nargs="+", default=None, metavar="B",
        help="compare batched decoding at these batch sizes (B prompts of different lengths) instead",
    )
    parser.add_argument("--layouts", nargs="+", choices=LAYOUTS, default=["holes"],
                        help="KV-cache layouts of the batched decoder to time (default: holes)")
    parser.add_argument("--head", help="a trained head file / directory (speculative rule): also time Head(threshold), "
                        "batched with --batch-sizes, else at batch 1 beside Fixed(K) (and in --breakdown)")
    parser.add_argument("--threshold", type=float, default=None,
                        help="the head's stop threshold h (default: the h the head records, chosen on dev)")
    parser.add_argument(
        "--goodput", action="store_true",
        help="with --batch-sizes: measure the batch costs on this device and compare the modelled goodput of "
        "batched Fixed(K) over --k-grid, and with --head of Head(h) and the batch-aware GoodputHead",
    )
    parser.add_argument("--profile", help="with --goodput: an SV profile file / directory: also batched SV, its rows' "
                        "verification lengths chosen jointly at the measured t_t(B, T)")
    parser.add_argument("--companion", help="the profile's companion model (hub id or directory); default: the zoo's")
    parser.add_argument("--engines", action="store_true",
                        help="run python -m benchmarks.engines instead (the other options are its own; see its --help)")
    parser.add_argument("--k-grid", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6, 8], metavar="K",
                        help="fixed K values of --goodput (default 1 2 3 4 5 6 8)")
    args = parser.parse_args(argv)
    if args.batch_sizes is not None and (min(args.batch_sizes) < 1 or args.breakdown or args.compile):
        parser.error("--batch-sizes takes sizes >= 1 and no --breakdown or --compile (a batch decodes eager)")
    if args.runs < 1:
        parser.error("--runs takes a count >= 1")
    if args.goodput and args.batch_sizes is None:
        parser.error("--goodput is used with --batch-sizes only")
    if (args.profile or args.companion) and not args.goodput:
        parser.error("--profile and --companion are used with --goodput only")
    if min(args.k_grid) < 1:
        parser.error("--k-grid takes K >= 1")
    if args.random_init and args.draft:
        parser.error("--random-init builds both models; drop --draft")
    return args


def zoo_dir_or_exit() -> Path:
    """The installed zoo's directory; without one, exit with status 2 and one line naming the install command."""
    try:
        return installed_zoo_dir()
    except FileNotFoundError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)


def load_pair(args: argparse.Namespace, device: torch.device) -> tuple[PreTrainedModel, PreTrainedModel, str]:
    """Target, draft and a one-line description, from ``--random-init``, ``--target/--draft`` or the zoo."""
    if args.random_init:
        dtype = resolve_dtype(args.dtype)
        dtype = torch.float32 if dtype == "auto" else dtype
        target, draft = random_pair(args.random_init, device, dtype)
        return target, draft, f"random-init {args.random_init} ({dtype})"
    if args.target is None or args.draft is None:
        zoo = zoo_dir_or_exit()
        args.target = args.target or str(zoo / "target")
        args.draft = args.draft or str(zoo / "draft")
    args.target, args.draft = (resolve_model_id(ModelSpec(id=name)) for name in (args.target, args.draft))
    target = load_causal_lm(args.target, dtype=args.dtype).to(device)
    draft = load_causal_lm(args.draft, dtype=args.dtype).to(device)
    return target, draft, f"target={Path(args.target).name} draft={Path(args.draft).name}"


def load_companion(args: argparse.Namespace, device: torch.device) -> PreTrainedModel | None:
    """The SV profile's companion (``--companion``, else the zoo's); None without ``--profile``."""
    if not args.profile:
        return None
    if args.companion is None and args.random_init:
        print("error: --profile with --random-init needs --companion", file=sys.stderr)
        sys.exit(2)
    path = resolve_model_id(ModelSpec(id=args.companion)) if args.companion else str(zoo_dir_or_exit() / "companion")
    return load_causal_lm(path, dtype=args.dtype).to(device)


def main(argv: list[str] | None = None) -> list[Result] | list[BatchResult] | list[GoodputRow]:
    """Run the benchmark and print the table; returns the per-method (per-batch-size) results."""
    argv = sys.argv[1:] if argv is None else argv
    if "--engines" in argv:
        return engines.main([arg for arg in argv if arg != "--engines"])
    args = parse_args(argv)
    quiet_library_output()
    torch_threads(args.threads or None)
    device = args.device
    target, draft, described = load_pair(args, device)
    budget = args.max_new_tokens
    eos = target.generation_config.eos_token_id if args.stop_at_eos else None
    # eos_token_id=None (no --stop-at-eos) overrides the generation config's: every prompt decodes the whole budget.
    common = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "max_new_tokens": budget,
              "eos_token_id": eos}
    if target.generation_config.pad_token_id is None:
        common["pad_token_id"] = pad_id(None, eos)
    if args.batch_sizes is not None and args.goodput:
        print(f"{described} device={device} max_new_tokens={budget}")
        prompts = batch_prompts(args.target, max(args.batch_sizes), target.config.get_text_config().vocab_size, device)
        return run_goodput(args, target, draft, prompts, eos, companion=load_companion(args, device))
    if args.batch_sizes is not None:
        print(f"{described} device={device} K={args.k}")
        return run_batched(args, target, draft, eos, device)
    prompts = make_prompts(args.target, args.prompts, target.config.get_text_config().vocab_size, device)
    HFConstantSpec(args.k).schedule().apply(draft.generation_config)  # the evaluation's constant-K baseline
    rule = Speculative()
    decoder = SpeculativeDecoder(target, draft, rule=rule, policy=Fixed(args.k), sampling=Sampling(), eos_token_id=eos)

    def hf_generate(assistant: PreTrainedModel | None) -> Run:
        def run(prompt: torch.Tensor, seed: int) -> torch.Tensor:
            torch.manual_seed(seed)
            with torch.inference_mode():
                return target.generate(
                    prompt, attention_mask=torch.ones_like(prompt), assistant_model=assistant, **common
                )

        return run

    def ours(prompt: torch.Tensor, seed: int) -> torch.Tensor:
        return decoder.generate(prompt, max_new_tokens=budget, seed=seed).sequences

    fast_decoders: list[SpeculativeDecoder] = []

    def compiled(policy: Policy) -> Run:
        fast_decoders.append(SpeculativeDecoder(target, draft, rule=rule, policy=policy, sampling=Sampling(),
                                                eos_token_id=eos, compile=True))
        fast = fast_decoders[-1]
        return lambda prompt, seed: fast.generate(prompt, max_new_tokens=budget, seed=seed)

    methods: list[tuple[str, Run, Rule | None, torch.nn.Module | None]] = [
        ("target alone (HF generate)", hf_generate(None), None, None),
        (f"HF assisted, constant K={args.k}", hf_generate(draft), None, None),
        (f"decode Fixed({args.k})", ours, rule, None),
    ]
    compiled_methods = [("decode TargetOnly, compiled", compiled(TargetOnly())),
                        (f"decode Fixed({args.k}), compiled", compiled(Fixed(args.k)))] if args.compile else []
    if args.head:
        head = load_head(args.head, draft=draft, sampling=Sampling(), rule=rule)
        at_h = Head(head, threshold=args.threshold)
        with_head = SpeculativeDecoder(target, draft, rule=rule, policy=at_h, sampling=Sampling(), eos_token_id=eos)

        def ours_with_head(prompt: torch.Tensor, seed: int) -> torch.Tensor:
            return with_head.generate(prompt, max_new_tokens=budget, seed=seed).sequences

        methods.append((f"decode Head(h={at_h.threshold})", ours_with_head, rule, head))
    ratios: dict[str, list[float]] = {}
    for run_index in range(args.runs):
        results = measure([(name, run) for name, run, _, _ in methods] + compiled_methods, prompts, target, draft)
        which = f" run {run_index + 1}/{args.runs}" if args.runs > 1 else ""
        print(f"{described} device={device} prompts={len(prompts)} max_new_tokens={budget} K={args.k}{which}")
        print(f"{'method':<28} {'tokens/s':>10} {'vs target':>8} {'tgt/token':>10} {'drf/token':>10} {'tokens':>8} "
              f"{'seconds':>9}")
        baseline = results[0].tokens / results[0].seconds if results[0].seconds else None
        for result in results:
            print(result.row(baseline))
        hf = results[1]
        for ours_result in (results[2], *results[len(methods):]):
            if hf.rate and ours_result.rate and "Fixed" in ours_result.name:
                ratios.setdefault(ours_result.name, []).append(ours_result.rate / hf.rate)
                print(f"{ours_result.name} / HF assisted tokens/s: {ratios[ours_result.name][-1]:.2f}x")
    if fast_decoders:  # the target's and the draft's compiled forwards are shared by every compiled decoder
        print(engines.compile_line(fast_decoders[-1].compiled_models()))
    if args.runs > 1:
        for name, values in ratios.items():
            print(f"{name} / HF assisted tokens/s over {args.runs} runs: median {median(values):.2f}x "
                  f"(runs {min(values):.2f}x–{max(values):.2f}x)")
    if args.breakdown:
        print_breakdown([breakdown(name, run, prompts, target, draft, timed, head)
                         for name, run, timed, head in methods])
    return results


if __name__ == "__main__":
    main()
