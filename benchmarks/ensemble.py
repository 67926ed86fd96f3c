"""Speculative Ensemble vs the plain ensemble on the zoo's draft / companion / target.

    python -m benchmarks.ensemble [--zoo-dir DIR] [--prompts 4] [--max-new-tokens 64] [--gammas 1,5]

Ensembles: draft+target and draft+companion+target (the draft, smallest, proposes), each
``weighted`` (uniform weights) and ``contrastive`` (expert = target, ``μ`` for every other model).
Methods: ``plain`` (every model once per token), ``sd`` (draft proposes γ, the others verify) and
``alternate`` (SE; γ for the draft, 1 for the others). Every method decodes the full budget of the
same prompts with the same seeds. Speed-ups over ``plain`` are given by the cost model
``Σ_i t_i · calls_i`` with ``t_i`` proportional to parameter count and with ``t_i`` = measured
seconds per single-token call of model ``i`` in the plain runs, and by wall-clock tokens/s.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import PreTrainedModel

from ahconf.entry import quiet_library_output
from benchmarks.decoding import PhaseTimer, make_prompts, zoo_dir_or_exit
from benchmarks.devices import add_device_option
from decode.artifacts.hub import load_causal_lm
from decode.ensemble.decoder import EnsembleDecoder
from decode.ensemble_fn import DEFAULT_MU, EnsembleFn
from decode.sampling import Sampling
from decode.threads import torch_threads

ROLES = ("draft", "companion", "target")


@dataclass
class Row:
    """Totals of one (ensemble, kind, method) over all prompts."""

    ensemble: str
    kind: str
    method: str
    tokens: int = 0
    seconds: float = 0.0
    accepted: int = 0
    verified: int = 0
    calls: list[int] = field(default_factory=list)
    call_seconds: list[float] = field(default_factory=list)


def run(decoder: EnsembleDecoder, row: Row, prompts: list[torch.Tensor], budget: int) -> Row:
    """Decode every prompt (after one warm-up) and accumulate the row."""
    decoder.generate(prompts[0], max_new_tokens=min(budget, 4), seed=0)
    timer = PhaseTimer(decoder.device)
    for index, model in enumerate(decoder.models):
        timer.module(f"model {index}", model)
    try:
        for seed, prompt in enumerate(prompts):
            out = decoder.generate(prompt, max_new_tokens=budget, seed=seed)
            s = out.stats
            row.tokens += s.generated
            row.seconds += s.wall_time_s
            row.accepted += s.accepted
            row.verified += s.accepted + s.rejected
    finally:
        timer.close()
    row.calls = [timer.calls.get(f"model {index}", 0) for index in range(len(decoder.models))]
    row.call_seconds = [timer.seconds[f"model {index}"] for index in range(len(decoder.models))]
    return row


def speedup(row: Row, plain: Row, costs: list[float]) -> float:
    """Modelled time per token of ``plain`` over that of ``row`` under per-call ``costs``."""
    per_token = sum(c * k for c, k in zip(costs, row.calls)) / row.tokens
    return sum(c * k for c, k in zip(costs, plain.calls)) / plain.tokens / per_token


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ensemble", description=__doc__.split("\n\n")[0])
    parser.add_argument("--zoo-dir", help="directory with draft/, companion/, target/ (default: the built-in zoo)")
    parser.add_argument("--prompts", type=int, default=4, help="number of prompts")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--gammas", default="1,5", help="comma-separated draft proposal lengths for sd / alternate")
    parser.add_argument(
        "--mu", type=float, default=DEFAULT_MU, help="contrastive coefficient of every non-target model"
    )
    parser.add_argument("--temperature", type=float, default=1.0)
    add_device_option(parser, default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> list[Row]:
    """Run the benchmark, print the table and return its rows."""
    args = parse_args(argv)
    quiet_library_output()
    torch_threads(args.threads or None)
    root = Path(args.zoo_dir) if args.zoo_dir is not None else zoo_dir_or_exit()
    device = args.device
    models: dict[str, PreTrainedModel] = {
        role: load_causal_lm(str(root / role), dtype="float32").to(device) for role in ROLES
    }
    params = {role: model.num_parameters() for role, model in models.items()}
    vocab = models["target"].config.get_text_config().vocab_size
    prompts = make_prompts(str(root / "target"), args.prompts, vocab, device)
    gammas = [int(g) for g in args.gammas.split(",")]
    sampling = Sampling(temperature=args.temperature)
    print(f"zoo={root} device={device} prompts={len(prompts)} max_new_tokens={args.max_new_tokens} "
          f"T={args.temperature} mu={args.mu} params=" + ", ".join(f"{r}:{p / 1e6:.2f}M" for r, p in params.items()))
    header = (f"{'ensemble':<24} {'kind':<12} {'method':<16} {'tok/call':>8} {'accept':>7} {'calls/token per model':>24} "
              f"{'x params':>9} {'x measured':>10} {'x wall':>7}")
    print(header)
    print("-" * len(header))
    rows: list[Row] = []
    notes: list[str] = []
    for roles in (("draft", "target"), ("draft", "companion", "target")):
        members, n, name = [models[r] for r in roles], len(roles), "+".join(roles)
        for kind in ("weighted", "contrastive"):
            fn = EnsembleFn("weighted") if kind == "weighted" else EnsembleFn("contrastive", mu=args.mu)
            methods: list[tuple[str, str, list[int] | None]] = [("plain", "plain", None)]
            methods += [(f"sd γ={g}", "sd", [g] + [1] * (n - 1)) for g in gammas]
            methods += [(f"alternate γ={g}", "alternate", [g] + [1] * (n - 1)) for g in gammas]
            group = []
            for label, mode, lengths in methods:
                decoder = EnsembleDecoder(members, fn, lengths, mode, sampling, eos_token_id=None)
                group.append(run(decoder, Row(name, kind, label), prompts, args.max_new_tokens))
            plain = group[0]
            measured = [sec / calls for sec, calls in zip(plain.call_seconds, plain.calls)]
            notes.append(f"{name} {kind}: " + ", ".join(f"{r} {t * 1e3:.2f} ms" for r, t in zip(roles, measured)))
            by_params = [float(params[r]) for r in roles]
            for row in group:
                per_model = "/".join(f"{calls / row.tokens:.2f}" for calls in row.calls)
                accept = f"{row.accepted / row.verified:.3f}" if row.verified else "-"
                wall = (row.tokens / row.seconds) / (plain.tokens / plain.seconds)
                print(f"{row.ensemble:<24} {row.kind:<12} {row.method:<16} {row.tokens / sum(row.calls):8.3f} "
                      f"{accept:>7} {per_model:>24} {speedup(row, plain, by_params):8.2f}x "
                      f"{speedup(row, plain, measured):9.2f}x {wall:6.2f}x")
            rows.extend(group)
    print("measured time per single-token call (plain runs):")
    for note in notes:
        print(f"  {note}")
    return rows


if __name__ == "__main__":
    main()
