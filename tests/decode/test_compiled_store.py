"""Compiled graphs are built once per machine (:mod:`decode.compile.store`): a second process loads them, a changed key
builds anew and a corrupt folder is refused and rebuilt, each with one line."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from decode.compile.store import GRAPHS, MANIFEST, CompiledStoreNotice, GraphKey, GraphStore
from tests.helpers.compiler import needs_compiler

DECODE_ONCE = """
import json, warnings
import torch
from torch._dynamo.utils import counters
from decode import SpeculativeDecoder, policies, rules
from tests.helpers.micro_models import micro_lm

warnings.simplefilter("always")
target, draft = micro_lm(96, seed=21, hidden=32, layers=2, init=0.3), micro_lm(96, seed=22, hidden=16, init=0.3)
decoder = SpeculativeDecoder(target, draft, rule=rules.Greedy(), policy=policies.Fixed(3), eos_token_id=None,
                             compile=True)
with warnings.catch_warnings(record=True) as caught:
    out = decoder.generate(torch.tensor([[1, 5, 9, 2, 6, 5, 3]]), 16)
print(json.dumps({"tokens": out.sequences[0].tolist(), "compiled": out.stats.compile is not None,
                  "built": counters["inductor"]["fxgraph_cache_miss"], "loaded": counters["inductor"]["fxgraph_cache_hit"],
                  "notices": [str(w.message) for w in caught if w.category.__name__ == "CompiledStoreNotice"]}))
"""


def decode_in_a_new_process(store: Path, repo_root: Path) -> dict:
    env = {**os.environ, "ACCEPT_HEADS_COMPILED_DIR": str(store), "PYTHONPATH": str(repo_root)}
    done = subprocess.run([sys.executable, "-c", DECODE_ONCE], capture_output=True, text=True, env=env, cwd=repo_root,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@needs_compiler
def test_a_second_process_loads_the_graphs_and_compiles_nothing(tmp_path, repo_root):
    first = decode_in_a_new_process(tmp_path, repo_root)
    second = decode_in_a_new_process(tmp_path, repo_root)
    assert first["compiled"] and second["compiled"]
    # negative control: the first process built the target's and the draft's graphs, saying so
    assert first["built"] >= 2 and len(first["notices"]) == 2 and all("building" in n for n in first["notices"])
    assert (second["built"], second["notices"]) == (0, []) and second["loaded"] >= 2
    assert second["tokens"] == first["tokens"]  # float32: the loaded graphs decode what the built ones did
    assert len(list(tmp_path.glob(f"*/{MANIFEST}"))) == 2


def a_key(**changes) -> GraphKey:
    key = GraphKey(model="LlamaForCausalLM (/models/target)", weights="ab" * 32, torch="2.13.0", device="AMD EPYC",
                   capability="AVX512", dtype="bfloat16", threads=2, cache_length=256, settings="{}")
    return dataclasses.replace(key, **changes)


def build(store: GraphStore, key: GraphKey, payload: bytes = b"kernel") -> list[str]:
    """What building ``key``'s graphs in ``store`` says (a stand-in for inductor writing its files there)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with store.building(key):
            folder = store.folder(key) / GRAPHS
            (folder / "graph.so").write_bytes(payload)
            (folder / "locks").mkdir(exist_ok=True)
            (folder / "locks" / "graph.lock").write_bytes(b"")  # inductor's locks are not part of the graphs
    store.commit(key)
    return [str(w.message) for w in caught if issubclass(w.category, CompiledStoreNotice)]


def test_a_stored_key_loads_without_a_line(tmp_path):
    assert len(build(GraphStore(tmp_path), a_key())) == 1  # built: one line
    assert build(GraphStore(tmp_path), a_key()) == []  # a later process: nothing said, nothing removed
    manifest = json.loads((GraphStore(tmp_path).folder(a_key()) / MANIFEST).read_text())
    assert list(manifest["files"]) == ["graph.so"] and manifest["key"] == dataclasses.asdict(a_key())


@pytest.mark.parametrize(("change", "said"), [
    ({"weights": "cd" * 32}, "weights abababababab -> cdcdcdcdcdcd"),  # the model's file changed
    ({"torch": "2.14.0"}, "torch 2.13.0 -> 2.14.0"),
    ({"capability": "AVX2"}, "capability AVX512 -> AVX2"),
])
def test_a_changed_key_builds_anew_with_one_line_naming_the_change(tmp_path, change, said):
    build(GraphStore(tmp_path), a_key())
    lines = build(GraphStore(tmp_path), a_key(**change))
    assert len(lines) == 1 and said in lines[0] and "\n" not in lines[0]
    assert GraphStore(tmp_path).folder(a_key(**change)) != GraphStore(tmp_path).folder(a_key())
    # the old graphs stay for whoever still runs that key, and load without a line
    assert build(GraphStore(tmp_path), a_key()) == []


def test_a_changed_key_names_the_nearest_stored_key(tmp_path):
    build(GraphStore(tmp_path), a_key(threads=1, settings='{"other": 1}'))
    build(GraphStore(tmp_path), a_key(threads=1))
    (line,) = build(GraphStore(tmp_path), a_key())  # one field from the second, two from the first
    assert "threads 1 -> 2" in line and "settings" not in line


def test_a_corrupt_folder_is_refused_with_one_line_and_rebuilt(tmp_path):
    build(GraphStore(tmp_path), a_key())
    stored = GraphStore(tmp_path).folder(a_key()) / GRAPHS / "graph.so"
    stored.write_bytes(b"kernel, altered")
    lines = build(GraphStore(tmp_path), a_key(), payload=b"kernel, rebuilt")
    assert len(lines) == 1 and "refused" in lines[0] and "graph.so differs" in lines[0]
    assert stored.read_bytes() == b"kernel, rebuilt"  # the altered file was removed before the build
    assert build(GraphStore(tmp_path), a_key(), payload=b"kernel, rebuilt") == []  # and the rebuilt one loads


def test_a_folder_without_its_manifest_is_built_afresh(tmp_path):
    """An interrupted build leaves files but no manifest: they are not trusted."""
    folder = GraphStore(tmp_path).folder(a_key()) / GRAPHS
    folder.mkdir(parents=True)
    (folder / "half-written.so").write_bytes(b"?")
    assert len(build(GraphStore(tmp_path), a_key())) == 1
    assert not (folder / "half-written.so").exists()
