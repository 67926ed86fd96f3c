"""Compiled graphs are built once per machine (:mod:`decode.compile.store`): a second process loads them, a changed key
builds anew and a corrupt folder is refused and rebuilt, each with one line; a key is built under its lock (another
process waits, a gone builder's lock is taken over), older folders are pruned, and ``python -m decode.compile``
lists and clears the store."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import threading
import time
import types
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import decode.compile.store as store_module
from decode.compile.__main__ import main, state
from decode.compile.key_lock import (
    UNREADABLE_AFTER,
    process_start,
    process_status,
    read_lock,
    set_aside,
    try_lock,
    unlock,
)
from decode.compile.store import COMMAND, GRAPHS, KEEP, MANIFEST, STORE_ENV, CompiledStoreNotice, GraphKey, GraphStore
from tests.helpers.compiler import needs_compiler
from tests.helpers.micro_models import micro_lm

MODELS = """
import json, warnings
import torch
from torch._dynamo.utils import counters
from decode import SpeculativeDecoder, policies, rules
from tests.helpers.micro_models import micro_lm

warnings.simplefilter("always")
target, draft = micro_lm(96, seed=21, hidden=32, layers=2, init=0.3), micro_lm(96, seed=22, hidden=16, init=0.3)
decoder = SpeculativeDecoder(target, draft, rule=rules.Greedy(), policy=policies.Fixed(3), eos_token_id=None,
                             compile=True)
"""
DECODE = """
with warnings.catch_warnings(record=True) as caught:
    out = decoder.generate(torch.tensor([[1, 5, 9, 2, 6, 5, 3]]), 16)
print(json.dumps({"tokens": out.sequences[0].tolist(), "compiled": out.stats.compile is not None,
                  "built": counters["inductor"]["fxgraph_cache_miss"],
                  "loaded": counters["inductor"]["fxgraph_cache_hit"],
                  "notices": [str(w.message) for w in caught if w.category.__name__ == "CompiledStoreNotice"]}))
"""
DECODE_ONCE = MODELS + DECODE
# both processes decode from the same moment on: each names itself in the folder argv[1], then waits for the other
TOGETHER = """
import os, sys, time, pathlib
ready = pathlib.Path(sys.argv[1])
(ready / str(os.getpid())).touch()
while len(list(ready.iterdir())) < 2:
    time.sleep(0.02)
"""


def environment(store: Path, repo_root: Path) -> dict[str, str]:
    return {**os.environ, "ACCEPT_HEADS_COMPILED_DIR": str(store), "PYTHONPATH": str(repo_root)}


def decode_in_a_new_process(store: Path, repo_root: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", DECODE_ONCE], capture_output=True, text=True,
                          env=environment(store, repo_root), cwd=repo_root, check=False)
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


def build_files(store: GraphStore, key: GraphKey, payload: bytes = b"kernel", name: str = "graph.so") -> None:
    """Build ``key``'s graphs in ``store``: a stand-in for inductor writing its files there (kept where it finds them
    stored, as inductor's cache does)."""
    with store.building(key):
        folder = store.folder(key) / GRAPHS
        if not (folder / name).exists():
            (folder / name).write_bytes(payload)
        (folder / "locks").mkdir(exist_ok=True)
        (folder / "locks" / "graph.lock").write_bytes(b"")  # inductor's locks are not part of the graphs
    store.commit(key)


def notices(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, CompiledStoreNotice)]


def build(store: GraphStore, key: GraphKey, payload: bytes = b"kernel") -> list[str]:
    """What building ``key``'s graphs in ``store`` says."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build_files(store, key, payload)
    return notices(caught)


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


@pytest.fixture
def builder() -> Iterator[subprocess.Popen]:
    """A live process standing in for another process that builds a key."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield process
    process.kill()
    process.wait()


@pytest.fixture
def never_waits(monkeypatch) -> None:
    """A wait for another process's build fails the test at once (where the lock is to be taken, not waited for)."""
    def waited(seconds: float) -> None:
        raise AssertionError("building waited for a lock it should have taken")

    monkeypatch.setattr(store_module, "time", types.SimpleNamespace(time=time.time, sleep=waited))


def gone_pid() -> int:
    """The pid of a process that has finished."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


@pytest.fixture
def unreaped() -> Iterator[subprocess.Popen]:
    """A process that has ended but that its parent (this one) has not waited for yet: a zombie."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    while process_status(process.pid)[0] != "Z":
        time.sleep(0.01)
    yield process
    process.wait()


def write_lock(lock: Path, pid: int, start: str | None = None) -> None:
    """A lock file naming ``pid``, as that process writes it."""
    lock.write_text(json.dumps({"pid": pid, "host": socket.gethostname(), "start": start or process_start(pid)}))


def half_built(store: GraphStore, key: GraphKey) -> Path:
    """A file of ``key``'s graphs that a build has written so far (no manifest yet)."""
    folder = store.folder(key) / GRAPHS
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "half.so").write_bytes(b"half")
    return folder / "half.so"


def first_line(lines, text: str, running) -> str:
    """The first of ``lines()`` holding ``text``, looked for while ``running()`` (two minutes at most)."""
    deadline = time.monotonic() + 120
    while True:
        found = [line for line in lines() if text in line]
        if found:
            return found[0]
        if not running() or time.monotonic() > deadline:
            raise AssertionError(f"no line with {text!r} in {lines()}")
        time.sleep(0.01)


def test_a_lock_is_taken_once_names_its_process_and_goes_with_unlock(tmp_path, builder):
    lock = tmp_path / "key.lock"
    assert try_lock(lock) == (True, None)
    owner = read_lock(lock)
    assert owner.mine() and owner.live() and owner.pid == os.getpid()
    assert try_lock(lock) == (True, None)  # re-entrant within a process
    unlock(lock)
    assert not lock.exists()
    write_lock(lock, builder.pid)
    taken, owner = try_lock(lock)
    assert not taken and owner.pid == builder.pid and owner.live()
    unlock(lock)  # not this process's: it stays
    assert read_lock(lock).pid == builder.pid
    lock.write_bytes(b"")  # just created, its process not yet named: held
    taken, owner = try_lock(lock)
    assert not taken and owner.pid is None and lock.read_bytes() == b""


def test_only_the_waiter_that_moved_the_abandoned_lock_itself_wins_it(tmp_path, builder):
    lock = tmp_path / "key.lock"
    write_lock(lock, gone_pid())
    judged = read_lock(lock)  # every waiter judged it abandoned
    assert not judged.live()
    assert set_aside(lock, judged) and not lock.exists()  # the first to move it wins
    assert not set_aside(lock, judged)  # the next finds nothing to move
    write_lock(lock, builder.pid)  # the lock taken meanwhile
    taken = lock.read_bytes()
    assert not set_aside(lock, judged)  # a late waiter moves that one: not the one it judged, so it is put back
    assert lock.read_bytes() == taken and read_lock(lock).live()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["key.lock"]


@pytest.mark.parametrize("left", ["a finished process", "an unreaped one", "a reused pid", "an old unreadable lock"])
def test_a_gone_builders_lock_is_taken_over_with_one_line_and_its_leftovers_removed(tmp_path, builder, unreaped,
                                                                                    left, never_waits):
    store = GraphStore(tmp_path)
    lock = store.lock_file(a_key().folder())
    half = half_built(store, a_key())
    pid = {"a finished process": gone_pid, "an unreaped one": lambda: unreaped.pid, "a reused pid": lambda: builder.pid,
           "an old unreadable lock": lambda: None}[left]()
    if pid is None:
        lock.write_bytes(b"")  # its process died before naming itself
        os.utime(lock, (time.time() - 2 * UNREADABLE_AFTER,) * 2)
    else:
        write_lock(lock, pid, start="0" if left == "a reused pid" else None)  # "0": the pid now runs another process
    lines = build(store, a_key())
    assert len(lines) == 2 and "took over from" in lines[0] and "building them" in lines[1]
    assert pid is None or f"took over from process {pid}, which is gone" in lines[0]
    assert not half.exists() and not lock.exists()  # the leftovers removed, the lock given up by the commit
    assert build(GraphStore(tmp_path), a_key()) == []  # and the graphs verify


@pytest.mark.parametrize("then", ["commits", "gives up"])
def test_a_key_a_live_process_builds_is_waited_for_with_one_line(tmp_path, builder, then):
    """While another live process holds the key's lock, building waits (one line) and removes nothing; then it loads
    what that process committed, or builds the key itself where that process gave up without a manifest."""
    key, folder = a_key(), GraphStore(tmp_path).folder(a_key())
    lock = GraphStore(tmp_path).lock_file(key.folder())
    write_lock(lock, builder.pid)
    half = half_built(GraphStore(tmp_path), key)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        waiter = threading.Thread(target=build_files, args=(GraphStore(tmp_path), key, b"waiter's"), daemon=True)
        waiter.start()
        line = first_line(lambda: notices(caught), "waiting for", waiter.is_alive)
        assert waiter.is_alive() and half.exists()  # it waits, and removed nothing the live process builds
        if then == "commits":
            GraphStore(tmp_path).commit(key)  # as that process does, before giving up its lock
        lock.unlink()
        waiter.join(timeout=120)
    assert not waiter.is_alive()
    lines = notices(caught)
    assert lines[0] == line and f"waiting for process {builder.pid} building them in {folder}" in line
    if then == "commits":
        assert lines == [line] and half.exists()  # loaded: nothing refused, removed or rebuilt
    else:
        assert len(lines) == 2 and "building them" in lines[1] and not half.exists()
    assert not lock.exists() and build(GraphStore(tmp_path), key) == []


def test_without_the_lock_a_second_process_removes_the_folder_a_live_one_builds(tmp_path, builder, monkeypatch):
    """The waiting test's negative control: the lock bypassed, a second store removes what a live process builds."""
    write_lock(GraphStore(tmp_path).lock_file(a_key().folder()), builder.pid)
    half = half_built(GraphStore(tmp_path), a_key())
    monkeypatch.setattr(store_module, "try_lock", lambda path: (True, None))
    lines = build(GraphStore(tmp_path), a_key())
    assert len(lines) == 1 and "building them" in lines[0] and not half.exists()


def test_the_lock_is_held_across_building_until_commit_and_given_up_by_an_error(tmp_path, never_waits):
    store, key, other = GraphStore(tmp_path), a_key(), a_key(threads=4)
    graphs, lock = store.folder(key) / GRAPHS, store.lock_file(key.folder())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with store.building(key):
            (graphs / "one.so").write_bytes(b"1")
        assert read_lock(lock).mine()  # held between the entries
        with GraphStore(tmp_path).building(key):  # another store of this process: no wait, nothing removed
            (graphs / "two.so").write_bytes(b"2")
        store.commit(key)
        with pytest.raises(RuntimeError, match="fails"), GraphStore(tmp_path).building(other):
            raise RuntimeError("a compilation that fails")
    assert [("building th" in line) for line in notices(caught)] == [True, True]  # "them", "these" (a changed key)
    assert not lock.exists() and not store.lock_file(other.folder()).exists()
    assert sorted(json.loads((store.folder(key) / MANIFEST).read_text())["files"]) == ["one.so", "two.so"]


@needs_compiler
def test_a_compilation_that_fails_gives_up_the_keys_lock(tmp_path, monkeypatch):
    from torch._inductor.exc import CppCompileError

    from decode import SpeculativeDecoder, policies, rules

    def broken(**kwargs):
        raise CppCompileError(["c++"], "fatal error: Python.h: No such file or directory")

    monkeypatch.setattr(torch, "compile", lambda model, **options: broken)
    monkeypatch.setenv(STORE_ENV, str(tmp_path))
    target, draft = micro_lm(96, seed=31, hidden=32, layers=2, init=0.3), micro_lm(96, seed=32, hidden=16, init=0.3)
    decoder = SpeculativeDecoder(target, draft, rule=rules.Greedy(), policy=policies.TargetOnly(), eos_token_id=None,
                                 compile=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        decoder.generate(torch.tensor([[1, 5, 9, 2]]), 8)
    assert any("building them" in line for line in notices(caught))  # the key's lock was taken
    assert decoder.compiled_models()["target"].failed
    assert list(tmp_path.glob("*.lock")) == [] and list(tmp_path.glob(f"*/{MANIFEST}")) == []


WAIT_THEN_BUILD = """
import json, sys, warnings
from pathlib import Path
from decode.compile.store import GRAPHS, GraphKey, GraphStore

warnings.simplefilter("always")
store, (key, other) = GraphStore(Path(sys.argv[1])), [GraphKey(**key) for key in json.loads(sys.argv[2])]
with store.building(key):  # another process builds it: wait for it, then load its graphs
    found = sorted(path.name for path in (store.folder(key) / GRAPHS).iterdir())
with store.building(other):  # built here and never committed: its lock goes when the process exits
    (store.folder(other) / GRAPHS / "unfinished.so").write_bytes(b"?")
print(json.dumps(found))
"""


def test_another_process_waits_for_a_build_then_loads_it_and_its_own_lock_goes_at_exit(tmp_path, repo_root):
    store, key, other = GraphStore(tmp_path), a_key(), a_key(threads=8)
    with warnings.catch_warnings(record=True):
        with store.building(key):  # this process builds the key, under its lock
            (store.folder(key) / GRAPHS / "graph.so").write_bytes(b"kernel")
    keys = json.dumps([dataclasses.asdict(key), dataclasses.asdict(other)])
    said: list[str] = []
    with subprocess.Popen([sys.executable, "-c", WAIT_THEN_BUILD, str(tmp_path), keys], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=environment(tmp_path, repo_root),
                          cwd=repo_root) as waiter:
        reader = threading.Thread(target=lambda: [said.append(line) for line in waiter.stderr], daemon=True)
        reader.start()
        try:
            line = first_line(lambda: said, "waiting for", lambda: waiter.poll() is None)
            assert f"waiting for process {os.getpid()} building them in {store.folder(key)}" in line
            assert (store.folder(key) / GRAPHS / "graph.so").exists()  # nothing removed what this process builds
            store.commit(key)
            out = waiter.stdout.read()
        finally:
            waiter.kill()  # where it failed: it waits no longer
            waiter.wait()
            reader.join()
    assert waiter.returncode == 0, "".join(said)[-2000:]
    assert json.loads(out.strip().splitlines()[-1]) == ["graph.so"]  # it loaded this process's graphs
    notes = [line for line in said if "CompiledStoreNotice" in line]
    assert len(notes) == 2 and "waiting for" in notes[0] and f"building these in {store.folder(other)}" in notes[1]
    assert not store.lock_file(other.folder()).exists()  # given up at exit
    assert not (store.folder(other) / MANIFEST).exists() and build(GraphStore(tmp_path), key) == []


def fill(store: GraphStore, keys: list[GraphKey], monkeypatch) -> None:
    """Build ``keys`` in ``store``, oldest first (their manifests' times one second apart), none pruned."""
    with monkeypatch.context() as patched:
        patched.setattr(store_module, "KEEP", len(keys))
        for age, key in enumerate(keys):
            build(store, key)
            os.utime(store.folder(key) / MANIFEST, (1e9 + age,) * 2)


def test_a_commit_prunes_the_models_older_folders_but_the_newest_and_those_being_built(tmp_path, builder,
                                                                                       monkeypatch):
    store = GraphStore(tmp_path)
    old = [a_key(threads=n) for n in range(1, 6)]
    draft = [a_key(model="LlamaForCausalLM (/models/draft)", threads=n) for n in range(1, 6)]
    shorter = [a_key(cache_length=128, threads=n) for n in range(1, 6)]
    in_memory = [a_key(model="LlamaForCausalLM (in memory)", weights=f"{n:02d}" * 32) for n in range(1, 6)]
    fill(store, old + draft + shorter + in_memory, monkeypatch)
    write_lock(store.lock_file(old[0].folder()), builder.pid)  # the oldest is rebuilt by a live process
    lines = build(store, a_key(threads=6))
    assert len(lines) == 2 and "removed 2 older folders" in lines[1] and f"newest {KEEP} kept" in lines[1]
    assert COMMAND in lines[1] and "\n" not in lines[1]
    assert [store.folder(key).exists() for key in old] == [True, False, False, True, True]
    assert all(store.folder(key).exists() for key in draft + shorter + in_memory)  # other models, lengths, in memory


def test_the_command_lists_each_folder_and_whether_it_verifies(tmp_path, builder, capsys, monkeypatch):
    store = GraphStore(tmp_path)
    build(store, a_key())
    build(store, a_key(threads=4))
    (store.folder(a_key(threads=4)) / GRAPHS / "graph.so").write_bytes(b"altered")
    half_built(store, a_key(threads=8))
    half_built(store, a_key(threads=16))
    write_lock(store.lock_file(a_key(threads=16).folder()), builder.pid)
    assert main(["--dir", str(tmp_path)]) == 0
    header, *rows, total = capsys.readouterr().out.splitlines()
    assert header.split() == ["folder", "model", "cache", "rows", "threads", "dtype", "size", "written", "state"]
    shown = {row.split()[0]: row for row in rows}
    row = shown[a_key().folder()]
    assert "LlamaForCausalLM (/models/target)  256" in row and "bfloat16" in row and row.endswith("verified")
    assert "refused: graph.so differs from its sha256" in shown[a_key(threads=4).folder()]
    assert "no manifest" in shown[a_key(threads=8).folder()]
    assert shown[a_key(threads=16).folder()].endswith(f"being built by process {builder.pid}")
    assert len(rows) == 4 and total.startswith(f"4 folders, 0.0 MiB in {tmp_path}")
    monkeypatch.setenv(STORE_ENV, str(tmp_path))
    assert main([]) == 0 and capsys.readouterr().out.splitlines()[1:] == rows + [total]


def test_the_command_clears_every_folder_but_one_a_live_process_builds(tmp_path, builder, capsys):
    store = GraphStore(tmp_path)
    build(store, a_key())
    build(store, a_key(threads=4))
    half_built(store, a_key(threads=8))
    half_built(store, a_key(threads=32))
    write_lock(store.lock_file(a_key(threads=32).folder()), gone_pid())
    live = a_key(threads=16)
    half_built(store, live)
    write_lock(store.lock_file(live.folder()), builder.pid)
    assert main(["--dir", str(tmp_path), "--clear"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith(f"removed 4 folders (0.0 MiB) from {tmp_path}; kept {live.folder()}, being built by "
                           f"process {builder.pid}")
    assert sorted(path.name for path in tmp_path.iterdir()) == [live.folder(), f"{live.folder()}.lock"]


def test_the_command_prunes_every_model_to_its_newest_folders(tmp_path, capsys, monkeypatch):
    store = GraphStore(tmp_path)
    target = [a_key(threads=n) for n in range(1, 6)]
    draft = [a_key(model="LlamaForCausalLM (/models/draft)", threads=n) for n in range(1, 5)]
    fill(store, target + draft, monkeypatch)
    assert main(["--dir", str(tmp_path), "--prune"]) == 0
    assert capsys.readouterr().out == f"removed 3 folders from {tmp_path} (the newest {KEEP} of each model kept)\n"
    assert [store.folder(key).exists() for key in target + draft] == [False, False, True, True, True,
                                                                     False, True, True, True]


def test_the_command_says_bad_input_in_one_line(tmp_path, capsys):
    (tmp_path / "a file").write_text("")
    assert main(["--dir", str(tmp_path / "a file")]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'a file'} is no folder\n"
    for argv in (["--bogus"], ["--clear", "--prune"]):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        err = capsys.readouterr().err
        assert exited.value.code == 2 and len(err.splitlines()) == 1 and "(see --help)" in err
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0 and "--clear" in capsys.readouterr().out
    assert main(["--dir", str(tmp_path / "nothing yet")]) == 0
    assert capsys.readouterr().out == f"no compiled graphs in {tmp_path / 'nothing yet'}\n"


def test_the_command_runs_as_a_module(tmp_path, repo_root):
    build(GraphStore(tmp_path), a_key())
    done = subprocess.run([sys.executable, "-m", "decode.compile", "--dir", str(tmp_path)], capture_output=True,
                          text=True, env=environment(tmp_path, repo_root), cwd=repo_root, check=False)
    assert (done.returncode, done.stderr) == (0, "")  # no traceback, no warning about the module run twice
    assert done.stdout.splitlines()[1].endswith("verified")


def eager_tokens() -> list[int]:
    """What DECODE_ONCE's decoder decodes eager."""
    from decode import SpeculativeDecoder, policies, rules

    target, draft = micro_lm(96, seed=21, hidden=32, layers=2, init=0.3), micro_lm(96, seed=22, hidden=16, init=0.3)
    decoder = SpeculativeDecoder(target, draft, rule=rules.Greedy(), policy=policies.Fixed(3), eos_token_id=None)
    return decoder.generate(torch.tensor([[1, 5, 9, 2, 6, 5, 3]]), 16).sequences[0].tolist()


@needs_compiler
@pytest.mark.slow
def test_two_processes_compiling_one_model_at_once_build_it_once(tmp_path, repo_root):
    store, ready = tmp_path / "store", tmp_path / "ready"
    ready.mkdir()
    processes = [subprocess.Popen([sys.executable, "-c", MODELS + TOGETHER + DECODE, str(ready)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=environment(store, repo_root), cwd=repo_root) for _ in range(2)]
    done = [process.communicate(timeout=900) for process in processes]
    assert [process.returncode for process in processes] == [0, 0], [err[-2000:] for _, err in done]
    runs = [json.loads(out.strip().splitlines()[-1]) for out, _ in done]
    waited = [any("waiting for" in line for line in run["notices"]) for run in runs]
    assert sorted(waited) == [False, True]  # one waited for the other's build
    built, loaded = runs[waited.index(False)], runs[waited.index(True)]
    assert [("building them" in line) for line in built["notices"]] == [True, True]  # the target's and the draft's
    assert all("waiting for process" in line for line in loaded["notices"])  # nothing built, refused or removed
    assert loaded["built"] == 0 and loaded["loaded"] >= 2
    assert built["tokens"] == loaded["tokens"] == eager_tokens()
    entries = GraphStore(store).stored()  # one folder per key (the target's, the draft's), no lock left
    assert len(entries) == 2 and [state(GraphStore(store), entry) for entry in entries] == ["verified"] * 2
    assert sorted(path.suffix for path in store.iterdir()) == ["", ""]
