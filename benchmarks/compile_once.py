"""Compiled once per machine: how long a process waits for its first compiled token when it builds the graphs, and
when an earlier process built them (:mod:`decode.compile.store`).

    python -m benchmarks.compile_once [--pair smollm2] [--processes 2] [--store DIR]

Each process (one after another, nothing else running) loads the pair's target, opens a compiled decoder on it and
decodes two tokens of a chat-rendered prompt (the first comes from the prompt's eager forward, the second is the
first compiled one); it reports the seconds from opening the decoder to that token, and what
inductor did (graphs compiled, graphs loaded from the store). Without ``--store`` the processes share a fresh folder,
so the first builds the graphs and the later ones load them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from decode.compile.store import STORE_ENV

ONE_TOKEN = """
import json, sys, time, warnings
warnings.simplefilter("ignore")
import torch
from torch._dynamo.utils import counters
from ahconf.entry import quiet_library_output
quiet_library_output()
from benchmarks.real_pair import load_real_pair
from decode import SpeculativeDecoder, policies, rules
from decode.timing import machine_class
from model_build.real.build import encoded_prompts
real = load_real_pair(sys.argv[1], ("target",))
target = real.models["target"]
prompt = torch.tensor(encoded_prompts(real.spec, real.tokenizer, "builtin", "test", 1, 0, style="function")[:1])
start = time.perf_counter()
decoder = SpeculativeDecoder(target, target, rule=rules.Greedy(), policy=policies.TargetOnly(), eos_token_id=None,
                             compile=True)
out = decoder.generate(prompt, max_new_tokens=2)  # the first token comes from the prompt's eager forward
print(json.dumps({"seconds": time.perf_counter() - start, "compiled": out.stats.compile is not None,
                  "built": counters["inductor"]["fxgraph_cache_miss"], "loaded": counters["inductor"]["fxgraph_cache_hit"],
                  "machine": machine_class(target.device), "dtype": str(target.dtype)}))
"""


@dataclass(frozen=True)
class FirstToken:
    """One process's wait for its first compiled token."""

    seconds: float
    compiled: bool
    built: int  # graphs inductor compiled
    loaded: int  # graphs inductor found in the store
    machine: str
    dtype: str


def first_token(pair: str, store: Path) -> FirstToken:
    """Run one process with ``store`` as the graph store; its report."""
    env = {**os.environ, STORE_ENV: str(store)}
    done = subprocess.run([sys.executable, "-c", ONE_TOKEN, pair], capture_output=True, text=True, env=env,
                          check=False)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        sys.exit(f"error: the timed process exited {done.returncode}: {last}")
    return FirstToken(**json.loads(done.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> list[FirstToken]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compile_once", description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", default="smollm2", help="the real pair (default smollm2)")
    parser.add_argument("--processes", type=int, default=2, help="processes, one after another (default 2)")
    parser.add_argument("--store", type=Path, default=None, help="the graph store (default: a fresh folder)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as fresh:
        store = args.store or Path(fresh)
        runs = []
        for i in range(args.processes):
            print(f"waiting on process {i + 1} of {args.processes} (loads the target, compiles or loads its graphs, "
                  "decodes its first compiled token)", flush=True)
            runs.append(first_token(args.pair, store))
    table = Table(title=f"first compiled token, {runs[0].machine}, {runs[0].dtype}")
    for column in ("process", "seconds to the first token", "graphs compiled", "graphs loaded", "ran compiled"):
        table.add_column(column, justify="right")
    for i, run in enumerate(runs, 1):
        table.add_row(str(i), f"{run.seconds:.1f}", str(run.built), str(run.loaded), "yes" if run.compiled else "no")
    Console(width=120).print(table)
    return runs


if __name__ == "__main__":
    main()
