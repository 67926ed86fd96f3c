"""The decoding loop's speed: this tree's round loop against itself through the batch runner, and against another
revision's decoder (``--against REV``), at batch 1 and at larger batches.

    python -m benchmarks.loops [--target PATH --draft PATH | --random-init {tiny,1b}] [--against REV]
                               [--batch-sizes 1 8] [--prompts 16] [--max-new-tokens 128] [--k 5] [--repeats 3]

At batch 1 it times ``generate(prompt)`` (one row in its own cache) and ``generate([prompt])`` (the batched loop,
``generate_batch``: the batch runner's shared cache); at each larger B, ``generate`` on groups of B prompts. With
``--against REV`` the ``decode`` package of that git revision is exported into a temporary directory (its imports
renamed) and its ``generate`` runs on the same models, prompts and seeds. The methods take turns on every
prompt (or group) and repeat; the table gives each method's tokens per second and the ratio of its time to the
reference's per prompt (mean, with a 95 % interval over prompts). The reference is REV's ``generate`` of one prompt
at B = 1 and of the group at larger B when given, else this tree's.
"""

from __future__ import annotations

import argparse
import importlib
import math
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path
from types import ModuleType

import torch

from ahconf.entry import quiet_library_output
from benchmarks.decoding import RANDOM_PAIRS, batch_prompts, load_pair
from benchmarks.devices import add_device_option
from decode.threads import torch_threads
from decode.timing import Stopwatch

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.loops", description=__doc__.split("\n\n")[0])
    models = parser.add_mutually_exclusive_group()
    models.add_argument("--target", help="target model (hub id or directory); default: the zoo's target")
    parser.add_argument("--draft", help="draft model (hub id or directory); default: the zoo's draft")
    models.add_argument("--random-init", choices=sorted(RANDOM_PAIRS), help="a seeded random-init pair (see benchmarks.decoding)")
    parser.add_argument("--against", metavar="REV", help="also time the decoder of this git revision (e.g. a commit)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1], help="batch sizes (default 1)")
    parser.add_argument("--k", type=int, default=5, help="Fixed(k) candidates per round (default 5)")
    parser.add_argument("--prompts", type=int, default=16, help="number of prompts (default 16)")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="tokens per prompt (default 128)")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes over the prompts (default 3)")
    add_device_option(parser)
    parser.add_argument("--dtype", default="auto", help="auto, float32, bfloat16, float16")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    return parser.parse_args(argv)


def export_revision(rev: str, into: Path) -> ModuleType:
    """The ``decode`` package of git revision ``rev``, imported as ``decode_<rev>`` from a copy under ``into``."""
    try:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "decode"], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as error:
        detail = error.stderr.decode().strip() if isinstance(error, subprocess.CalledProcessError) else error
        sys.exit(f"error: cannot export decode/ at revision {rev!r} ({detail}); --against needs a git checkout")
    name = "decode_" + re.sub(r"\W", "_", rev)
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    package = into / name
    (into / "decode").rename(package)
    for path in package.rglob("*.py"):
        text = re.sub(r"\b(from|import) decode\b", rf"\1 {name}", path.read_text())
        path.write_text(text)
    sys.path.insert(0, str(into))
    return importlib.import_module(name)


@dataclass
class Method:
    """One decoder entry point, timed: ``run(prompts, seed)`` returns the tokens it generated."""

    name: str
    run: Callable[[list[torch.Tensor], int], int]
    seconds: list[float]
    tokens: int = 0


def decoder_methods(package: ModuleType, label: str, target, draft, k: int, budget: int, batch: int) -> list[Method]:
    """``package``'s decoder (this tree's ``decode`` or an exported revision's) as the methods timed at ``batch``."""
    decoder = package.SpeculativeDecoder(target, draft, rule=package.rules.Speculative(),
                                         policy=package.policies.Fixed(k), sampling=package.Sampling(),
                                         eos_token_id=None)

    def one(prompts: list[torch.Tensor], seed: int) -> int:
        return decoder.generate(prompts[0], max_new_tokens=budget, seed=seed).stats.generated

    def batched(prompts: list[torch.Tensor], seed: int) -> int:
        return decoder.generate(prompts, max_new_tokens=budget, seed=seed).totals.tokens

    if batch == 1:
        return [Method(f"{label} generate", one, []), Method(f"{label} generate_batch", batched, [])]
    return [Method(f"{label} generate_batch", batched, [])]


def timed(run: Callable[[], int], device: torch.device) -> tuple[float, int]:
    """Seconds and generated tokens of one call."""
    with Stopwatch(device) as watch:
        tokens = run()
    return watch.seconds, tokens


def mean_interval(values: list[float]) -> tuple[float, float, float]:
    """Mean and its 95 % normal interval."""
    mean = statistics.fmean(values)
    half = 1.96 * statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else math.nan
    return mean, mean - half, mean + half


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Time the methods at every batch size and print one table each; returns ``{"B=b name": tokens/s}`` and
    ``{"B=b name ratio": mean time ratio to the reference}`` (with ``… lo`` / ``… hi``)."""
    args = parse_args(argv)
    quiet_library_output()
    torch_threads(args.threads or None)
    device = args.device
    target, draft, described = load_pair(args, device)
    prompts = batch_prompts(args.target, args.prompts, target.config.get_text_config().vocab_size, device)
    import decode

    with tempfile.TemporaryDirectory() as scratch:
        packages = [(decode, "ours")]
        if args.against:
            packages.append((export_revision(args.against, Path(scratch)), args.against))
        figures = {}
        for batch in args.batch_sizes:
            figures |= time_batch(args, batch, prompts, packages, target, draft, device, described)
    return figures


def time_batch(args, batch: int, prompts: list[torch.Tensor], packages, target, draft, device,
               described: str) -> dict[str, float]:
    """Time every method on groups of ``batch`` prompts, taking turns; print the table."""
    per_package = [decoder_methods(package, label, target, draft, args.k, args.max_new_tokens, batch)
                   for package, label in packages]
    methods = [m for group in per_package for m in group]
    reference = per_package[-1][0]  # REV's (else ours) generate at B = 1, generate_batch above
    groups = [prompts[i: i + batch] for i in range(0, len(prompts) - batch + 1, batch)]
    for method in methods:  # warm-up
        method.run(groups[0], 0)
        method.seconds = [0.0] * len(groups)
    for repeat in range(args.repeats):
        for g, group in enumerate(groups):
            order = methods if (g + repeat) % 2 == 0 else methods[::-1]
            for method in order:
                elapsed, generated = timed(lambda: method.run(group, g), device)
                method.seconds[g] += elapsed
                method.tokens += generated
    print(f"{described}, device={device}, Fixed({args.k}), B={batch}: {len(groups)} groups x {args.max_new_tokens} "
          f"tokens x {args.repeats}")
    print(f"{'method':<34} {'tokens/s':>10} {'seconds':>9}   time / {reference.name} per group (95 %)")
    figures = {}
    for method in methods:
        total = sum(method.seconds)
        rate = method.tokens / total
        mean, lo, hi = mean_interval([s / r for s, r in zip(method.seconds, reference.seconds)])
        print(f"{method.name:<34} {rate:10.1f} {total:9.2f}   {mean:.3f} [{lo:.3f}, {hi:.3f}]")
        key = f"B={batch} {method.name}"
        figures |= {key: rate, f"{key} ratio": mean, f"{key} ratio lo": lo, f"{key} ratio hi": hi}
    return figures


if __name__ == "__main__":
    main()
