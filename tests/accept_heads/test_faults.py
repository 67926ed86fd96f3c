"""kill -9 fault tests (issue 77): head training resumed from ``last.ckpt`` and SV-profile fitting restarted export the
bytes of an uninterrupted run; an export or an evaluation's results killed while being written, and an evaluation
killed mid-decode, leave nothing incomplete that looks complete, and the rerun gives the uninterrupted run's results.

Each run is a subprocess of the command line, SIGKILLed (its process group) at a moment drawn from a seeded
``random.Random``: once a checkpoint of a drawn step appears, a drawn fraction of an uninterrupted run's time, a drawn
write of a save. The counts are the ``*_KILLS`` constants (the ``*_KILLS_SLOW`` loops: ``-m slow``).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors import safe_open

from accept_heads.evaluate import evaluate
from accept_heads.evaluation.results import RESULTS_FILES, load_results
from accept_heads.train import train
from decode.artifacts.serialization import METADATA_KEY, load_head, load_profile
from tests.helpers.config import DATA_OVERRIDES, EVAL_OVERRIDES, model_overrides
from tests.helpers.evaluation import write_artifacts

#: Head training: kills per run of the test (the first mid-epoch, then one once the last checkpoint is written).
TRAIN_KILLS = 2
TRAIN_KILLS_SLOW = 5
#: SV-profile fitting (no checkpoint: a rerun starts again).
PROFILE_KILLS = 2
PROFILE_KILLS_SLOW = 5
#: An export killed inside its write (a torn temp file, before the rename).
EXPORT_KILLS = 2
#: An evaluation killed mid-decode, then rerun.
EVAL_KILLS = 1
EVAL_KILLS_SLOW = 3
#: An evaluation's results killed while they are saved over an earlier evaluation's (``None`` in the slow loop: every
#: write of the save, before it and torn).
SAVE_KILLS = 2

EPOCHS, BATCHES = 3, 4  # 8 train prompts in batches of 2
STEPS = EPOCHS * BATCHES
POLL = 0.005
TIMEOUT = 300
SEED = 77
PROFILE_ARGS = ["head=sv_profile", "head.x_bins=4", "head.y_bins=3", "head.min_bin_count=4", "head.k_max=3",
                "head.latency_repeats=2", "head.latency_batches=[2,1]"]
#: Profile tensors measured on the wall clock (the target's latency): the one part of a profile that is run-dependent.
MEASURED_TENSORS = ("latency", "batch_latency_table")
#: Results measured on the wall clock (or fitted to it), and the metadata that records those measurements.
WALL_COLUMNS = re.compile(r"wall|fitted")
MEASURED_METADATA = ("cost_models", "cost_fit", "latency", "seconds")
#: The code version an artifact or a results file records: the checkout's commit, read by each process, which a commit
#: in a shared working tree moves between two runs of one test. Compared blanked; the bytes as written when it held.
CODE_VERSION = re.compile(re.escape(version("accept-heads")) + r"\+g[0-9a-f]+(?:\.dirty)?")
FRAMES = ("table", "generations", "calibration", "batch_axis", "wallclock", "wallclock_timings", "source_calibration")


def _env() -> dict[str, str]:
    """The tests' environment (offline, private costs store) with one thread per process: the same arithmetic in
    every run, as in the in-process references (``torch.set_num_threads(1)``)."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def _command(module: str, args: list[str]) -> list[str]:
    return [sys.executable, "-m", module, *args]


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _run(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    result = subprocess.run(command, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return result


def _run_and_kill(command: list[str], cwd: Path, log: Path, when: Callable[[], bool] = lambda: True,
                  delay: float = 0.0) -> int:
    """Run ``command`` until ``when()`` holds, then ``delay`` seconds more, then SIGKILL its process group; its return
    code (``-SIGKILL``: killed; otherwise it ended first; its output in ``log``)."""
    with log.open("w") as out:
        process = subprocess.Popen(command, cwd=cwd, env=_env(), stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        try:
            deadline = time.monotonic() + TIMEOUT
            while process.poll() is None and not when():
                assert time.monotonic() < deadline, f"{command[2]} did not reach its kill point in {TIMEOUT} s"
                time.sleep(POLL)
            end = time.monotonic() + delay
            while process.poll() is None and time.monotonic() < end:
                time.sleep(POLL)
            if process.poll() is None:
                _kill_group(process)
            return process.wait(timeout=60)
        finally:
            if process.poll() is None:
                _kill_group(process)
                process.wait(timeout=60)


def _timed_run(command: list[str], cwd: Path) -> float:
    start = time.monotonic()
    _run(command, cwd)
    return time.monotonic() - start


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _killed(rc: int, log: Path) -> None:
    assert rc == -signal.SIGKILL, f"the kill must land mid-run (exit {rc}): {log.read_text()[-3000:]}"


# --- head training -------------------------------------------------------------------------------------------------


def _train_args(train_overrides: list[str], root: Path) -> list[str]:
    """A head trained for 3 epochs of 4 steps, checkpointed at every step, under ``root``; every root is two folders
    below the pytest base temp, so the data's run-relative path is the same in every export."""
    data_dir = Path(train_overrides[-1].split("=", 1)[1]) / "tiny" / "data"
    return [*train_overrides, f"paths.root={root}", f"paths.data_dir={data_dir}", f"trainer.max_epochs={EPOCHS}",
            "trainer.checkpoint_every_n_steps=1", "ckpt_path=last"]


def _blank(data: bytes) -> tuple[bytes, set[str]]:
    """``data`` with the code versions it names blanked (:data:`CODE_VERSION`), and those versions."""
    text = data.decode("latin-1")
    return CODE_VERSION.sub("<code version>", text).encode("latin-1"), set(CODE_VERSION.findall(text))


def _export(directory: Path, name: str) -> dict[str, object]:
    """An export's and its model card's sha256: as written, and with the code version blanked (and that version)."""
    digests: dict[str, object] = {}
    for file in (name, "README.md"):
        data = (directory / file).read_bytes()
        blanked, versions = _blank(data)
        digests[file] = {"bytes": hashlib.sha256(data).hexdigest(), "blanked": hashlib.sha256(blanked).hexdigest(),
                         "versions": versions}
    return digests


def _same_export(got: dict[str, object], expected: dict[str, object]) -> None:
    """The same bytes, but for the code version if the checkout moved between the runs (then: the same otherwise)."""
    for file, digest in got.items():
        assert digest["blanked"] == expected[file]["blanked"], file
        if digest["versions"] == expected[file]["versions"]:
            assert digest["bytes"] == expected[file]["bytes"], file


class CheckpointStep:
    """The global step of a run's ``last.ckpt`` (-1: none yet), read again only when the file changes."""

    def __init__(self, path: Path) -> None:
        self.path, self.stamp, self.step = path, None, -1

    def __call__(self) -> int:
        try:
            stamp = self.path.stat().st_mtime_ns
        except FileNotFoundError:
            return -1
        if stamp != self.stamp:
            try:
                self.step = int(torch.load(self.path, map_location="cpu", weights_only=True)["global_step"])
                self.stamp = stamp
            except Exception:  # replaced while read: read it at the next poll
                pass
        return self.step


@pytest.fixture(scope="module")
def reference_head(make_config, train_overrides, tmp_path_factory) -> tuple[Path, dict[str, object]]:
    """An uninterrupted run's export (in this process): its folder and its sha256s."""
    root = tmp_path_factory.mktemp("faults") / "reference"
    train(make_config(*_train_args(train_overrides, root)).train_job())
    heads = root / "tiny" / "heads"
    return heads, _export(heads, "head.safetensors")


def _no_export_or_a_complete_one(heads: Path) -> None:
    """No half-written head presented as complete: none, or one that loads and matches the sha256 it records."""
    if (heads / "head.safetensors").exists():
        load_head(heads / "head.safetensors")


@pytest.mark.parametrize("kills", [TRAIN_KILLS, pytest.param(TRAIN_KILLS_SLOW, marks=pytest.mark.slow)])
def test_head_training_killed_and_resumed_from_last_ckpt_exports_the_same_bytes(train_overrides, reference_head,
                                                                                tmp_path, repo_root, kills):
    """``python -m accept_heads.train ckpt_path=last`` (the documented resume) rerun after each kill: killed mid-epoch
    once a drawn step's checkpoint is written (the first kill, and in the slow loop others drawn so), while it starts
    (a drawn fraction of the entry point's start-up time: slow loop), or once the last checkpoint is written (the last
    kill: during the final validation or the export, or after). A kill before the export leaves no head and no card
    (after it: a whole head); the final export's and model card's bytes are the uninterrupted run's (see
    :data:`CODE_VERSION`)."""
    rng = random.Random(SEED + kills)
    root = tmp_path / "killed"
    command = _command("accept_heads.train", _train_args(train_overrides, root))
    step = CheckpointStep(root / "tiny" / "train" / "specdecpp" / "checkpoints" / "last.ckpt")
    heads = root / "tiny" / "heads"
    startup = _timed_run(_command("accept_heads.train", ["--help"]), repo_root) if kills > TRAIN_KILLS else 0.0
    for kill in range(kills):
        log = tmp_path / f"kill{kill}.log"
        at = step()
        if kill == kills - 1:  # the last: once the final checkpoint is in, while it validates, exports, or is done
            _run_and_kill(command, repo_root, log, lambda: step() >= STEPS, rng.uniform(0, 0.5))
            _no_export_or_a_complete_one(heads)
            continue
        target = 0
        if kill == 0 or (at < STEPS - 3 and rng.random() < 0.6):  # mid-training, just after a drawn step's checkpoint
            target = rng.randint(max(at, 0) + 1, STEPS - 3)
            rc = _run_and_kill(command, repo_root, log, lambda: step() >= target, rng.uniform(0, 0.03))
        else:  # while it starts (imports, the draft, the data): nothing written yet
            rc = _run_and_kill(command, repo_root, log, delay=rng.uniform(0.1, 0.9) * startup)
        _killed(rc, log)
        assert not heads.exists() or not list(heads.iterdir()), "killed before the export: no head, no card"
        assert step() >= max(at, target)
    result = _run(command, repo_root)
    assert "Restored all states from the checkpoint" in result.stdout + result.stderr  # resumed, not restarted
    assert step() == STEPS
    _same_export(_export(heads, "head.safetensors"), reference_head[1])


_EXPORT_CHILD = """
import os, pathlib, signal, sys
from dataclasses import replace
from decode.artifacts.serialization import load_head, save_head
target, mode, cut = pathlib.Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
head = load_head(target)

def kill(source, destination):  # at the rename of the temp file into place (torn: the temp file cut at byte `cut`)
    if mode == "torn":
        os.truncate(source, min(cut, os.path.getsize(source)))
    os.kill(os.getpid(), signal.SIGKILL)

if mode != "none":
    os.replace = kill
save_head(head, target / "head.safetensors", replace(head.metadata, dev_metrics={"val/auroc": 0.25}))
"""


def test_an_export_killed_while_written_leaves_the_previous_head(reference_head, tmp_path, repo_root):
    """``save_head`` over an earlier export, SIGKILLed with its temp file written up to a drawn byte (as a kill
    mid-write leaves it), and written whole but not yet renamed: the earlier head is left, whole (its bytes, its
    recorded sha256). Control: the same save, not killed, replaces it."""
    rng = random.Random(SEED)
    source, digests = reference_head
    size = (source / "head.safetensors").stat().st_size
    for kill, mode in enumerate(["torn", "rename"][:EXPORT_KILLS]):
        target = tmp_path / f"export{kill}"
        shutil.copytree(source, target)
        cut = rng.randint(1, size - 1)
        rc = subprocess.run([sys.executable, "-c", _EXPORT_CHILD, str(target), mode, str(cut)], cwd=repo_root,
                            env=_env(), capture_output=True, text=True, timeout=TIMEOUT).returncode
        assert rc == -signal.SIGKILL
        assert _sha256(target / "head.safetensors") == digests["head.safetensors"]["bytes"]
        assert load_head(target).metadata.dev_metrics == load_head(source).metadata.dev_metrics
        assert [p.name for p in target.glob("*.safetensors")] == ["head.safetensors"]
    control = tmp_path / "control"
    shutil.copytree(source, control)
    _run([sys.executable, "-c", _EXPORT_CHILD, str(control), "none", "0"], repo_root)
    assert load_head(control).metadata.dev_metrics == {"val/auroc": 0.25}


# --- SV profile ----------------------------------------------------------------------------------------------------


def _profile(directory: Path) -> dict[str, object]:
    """A profile's bytes but the measured latency tables (and the header's sha256 of all tensors, which covers them):
    its metadata document and each other tensor, with its model card, as :func:`_export` gives them (checking first
    that the file's tensors hash to the sha256 it records)."""
    path = directory / "profile.safetensors"
    load_profile(path)  # verify: the tensors hash to the sha256 the header records
    with safe_open(str(path), framework="pt") as handle:
        document = (handle.metadata() or {})[METADATA_KEY]
        tensors = {name: handle.get_tensor(name) for name in handle.keys() if name not in MEASURED_TENSORS}
    kept = b"".join(f"{name}{t.dtype}{tuple(t.shape)}".encode() + t.numpy().tobytes()
                    for name, t in sorted(tensors.items()))
    parts = {"profile.safetensors": document.encode() + kept, "README.md": (directory / "README.md").read_bytes()}
    return {name: {"bytes": hashlib.sha256(data).hexdigest(), "blanked": hashlib.sha256(_blank(data)[0]).hexdigest(),
                   "versions": _blank(data)[1]} for name, data in parts.items()}


@pytest.mark.parametrize("kills", [PROFILE_KILLS, pytest.param(PROFILE_KILLS_SLOW, marks=pytest.mark.slow)])
def test_sv_profile_fitting_killed_and_rerun_exports_the_same_profile(train_overrides, tmp_path, repo_root, kills):
    """``python -m accept_heads.train head=sv_profile`` (nothing to resume: a rerun fits again) killed at drawn
    fractions of an uninterrupted run's time leaves no profile; the rerun's profile and card are the uninterrupted
    run's bytes but for the target's latency, which is measured (``MEASURED_TENSORS``)."""
    rng = random.Random(SEED + kills)
    args = [arg for arg in _train_args(train_overrides, tmp_path / "reference") if arg != "ckpt_path=last"]
    duration = _timed_run(_command("accept_heads.train", [*args, *PROFILE_ARGS]), repo_root)
    reference = _profile(tmp_path / "reference" / "tiny" / "heads")
    root = tmp_path / "killed"
    command = _command("accept_heads.train", [*args, f"paths.root={root}", *PROFILE_ARGS])
    heads = root / "tiny" / "heads"
    slow = kills > PROFILE_KILLS
    for kill in range(kills):
        log = tmp_path / f"kill{kill}.log"
        rc = _run_and_kill(command, repo_root, log, delay=rng.uniform(0.1, 0.95 if slow else 0.7) * duration)
        if not slow:
            _killed(rc, log)
            assert not heads.exists() or not list(heads.iterdir()), "killed before the export: no profile, no card"
        elif (heads / "profile.safetensors").exists():  # the slow loop's late kills may land in the export or after
            load_profile(heads / "profile.safetensors")
    _run(command, repo_root)
    _same_export(_profile(heads), reference)


# --- evaluation ----------------------------------------------------------------------------------------------------


def _eval_args(micro_trio: dict[str, Path], root: Path) -> list[str]:
    """The smallest evaluation the tests run (one rule, 2 prompts per set, 8 tokens; no HF, bounds, figures or
    calibration) of :func:`write_artifacts`'s heads and profile under ``root``; the companion at its configured price
    (``conf/config.yaml``), not at one measured on this machine, so that the dev choices are the same in every run."""
    return [*model_overrides(micro_trio), *DATA_OVERRIDES, *EVAL_OVERRIDES, f"paths.root={root}",
            f"paths.head_dir={root / 'heads'}", "evaluate.rules=[speculative]", "evaluate.hf.baselines=false",
            "evaluate.figures=false", "evaluate.calibration_rows=0", "evaluate.bounds=false", "cost.t_companion=0.0276"]


def _decisions(out_dir: Path, root: Path) -> dict:
    """What an evaluation decided, loaded from ``out_dir``: every table column not measured on the wall clock, every
    generation but its wall time, the league's calibration, and the metadata but its measurements (paths under ``root``
    as ``<root>``)."""
    results = load_results(out_dir)
    table = results.table[[c for c in results.table.columns if not WALL_COLUMNS.search(c)]]
    metadata = {k: v for k, v in results.metadata.to_dict().items() if k not in MEASURED_METADATA}
    text = CODE_VERSION.sub("<code version>", json.dumps(metadata, sort_keys=True, default=str))
    plain = json.loads(text.replace(str(root), "<root>"))
    return {"table": _lists(table), "generations": _lists(results.generations.drop(columns=["wall_s"])),
            "source_calibration": _lists(results.source_calibration), "metadata": plain}


def _lists(frame: pd.DataFrame) -> pd.DataFrame:
    """Array cells (list columns read back from Parquet) as lists, so frames compare cell by cell."""
    return frame.apply(lambda column: column.map(lambda v: v.tolist() if hasattr(v, "tolist") else v)
                       if column.dtype == object else column)


def _same_decisions(got: dict, expected: dict) -> None:
    for name in ("table", "generations", "source_calibration"):
        pd.testing.assert_frame_equal(got[name], expected[name], obj=name)
    assert got["metadata"] == expected["metadata"]


@pytest.fixture(scope="module")
def reference_evaluation(make_config, micro_trio, micro_root, tmp_path_factory) -> tuple[Path, dict]:
    """An uninterrupted evaluation (in this process): its results folder and its decisions."""
    root = tmp_path_factory.mktemp("faults_eval") / "reference"
    write_artifacts(root / "heads", micro_trio["draft"])
    config = make_config(*_eval_args(micro_trio, root))
    evaluate(config.evaluate_job())
    out_dir = Path(config.evaluate.out_dir)
    return out_dir, _decisions(out_dir, root)


def _no_results_or_complete_ones(out_dir: Path, root: Path, reference: dict) -> None:
    """Either nothing in ``out_dir`` loads or reads as results, or they are a whole evaluation's: the reference's."""
    if (out_dir / "results.parquet").exists():
        _same_decisions(_decisions(out_dir, root), reference)
    else:
        with pytest.raises(FileNotFoundError, match="no evaluation results"):
            load_results(out_dir)


@pytest.mark.slow  # two evaluations, about 50 s on 2 cores: the default run keeps the results-save kills
@pytest.mark.parametrize("kills", [EVAL_KILLS, EVAL_KILLS_SLOW])
def test_an_evaluation_killed_mid_decode_leaves_no_results_and_its_rerun_decides_as_an_uninterrupted_one(
        micro_trio, reference_evaluation, tmp_path, repo_root, kills):
    """``python -m accept_heads.evaluate`` killed once each head's h is recorded beside it (dev decoded, test / OOD
    not yet; the slow loop also at drawn fractions of an uninterrupted run's time) leaves no results file (a negative
    control: the kill lands before the save); the rerun (reusing the recorded h where its key matches) decides exactly
    as an uninterrupted evaluation: its table, generations and metadata but the wall clock's measurements."""
    rng = random.Random(SEED + kills)
    out_dir, reference = reference_evaluation
    root = tmp_path / "killed"
    write_artifacts(root / "heads", micro_trio["draft"])
    command = _command("accept_heads.evaluate", _eval_args(micro_trio, root))
    results = root / "tiny" / "eval"
    choice = root / "heads" / "pre" / "head.h_choice.json"
    duration = 0.0
    if kills > EVAL_KILLS:  # an uninterrupted run on the command line: its time, and its decisions are the reference's
        timed = tmp_path / "timed"
        write_artifacts(timed / "heads", micro_trio["draft"])
        duration = _timed_run(_command("accept_heads.evaluate", _eval_args(micro_trio, timed)), repo_root)
        _same_decisions(_decisions(timed / "tiny" / "eval", timed), reference)
    for kill in range(kills):
        log = tmp_path / f"kill{kill}.log"
        if kill == 0:  # mid-decode: the dev sweeps are done, test / OOD are decoding
            rc = _run_and_kill(command, repo_root, log, choice.exists, rng.uniform(0, 1.0))
            _killed(rc, log)
            assert choice.exists()
            assert not any((results / name).exists() for name in RESULTS_FILES)
            with pytest.raises(FileNotFoundError, match="no evaluation results"):
                load_results(results)
        else:  # later kills: at drawn moments (starting, decoding; reusing the recorded h, a rerun may be over)
            _run_and_kill(command, repo_root, log, delay=rng.uniform(0.2, 0.95) * duration)
            _no_results_or_complete_ones(results, root, reference)
    _run(command, repo_root)
    _same_decisions(_decisions(results, root), reference)


_SAVE_CHILD = """
import os, signal, sys
from dataclasses import replace
from pathlib import Path
import pyarrow.parquet as pq
from accept_heads.evaluation.results import LIST_COLUMNS, load_results, save_results
source, target, mode, at = sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
FRAMES = {frames!r}

def tagged(results, tag):  # every file of a save names the evaluation it is from (a column from_<tag>, empty or not)
    frames = {{name: getattr(results, name).assign(**{{"from_" + tag: tag}}) for name in FRAMES}}
    return replace(results, root=target, metadata=replace(results.metadata, exp_name=tag), **frames)

reference = load_results(source)
lists = {{c: reference.table[c].map(lambda v: v.tolist()) for c in LIST_COLUMNS if c in reference.table}}
reference = replace(reference, table=reference.table.assign(**lists))  # read back as arrays; saved from lists
save_results(tagged(reference, "old"))  # an earlier evaluation's complete results
writes = 0

def write(torn=None):  # the next write of the save: SIGKILL before it (or, torn, after it, its file cut in half)
    global writes
    writes += 1
    if writes == at and mode == "before":
        os.kill(os.getpid(), signal.SIGKILL)
    if writes == at and torn is not None:
        path = torn if isinstance(torn, (str, os.PathLike)) else None
        if path is None:
            torn.flush()
            os.ftruncate(torn.fileno(), os.fstat(torn.fileno()).st_size // 2)
        else:
            os.truncate(path, os.path.getsize(path) // 2)
        os.kill(os.getpid(), signal.SIGKILL)

def audit(event, args):  # text files opened for writing under the target
    if event == "open" and isinstance(args[0], (str, os.PathLike)) and str(target) in os.fspath(args[0]) \\
            and isinstance(args[1], str) and any(c in args[1] for c in "wax+"):
        write()

original = pq.write_table
def write_table(table, where, *args, **kwargs):
    if mode == "before":
        write()
    original(table, where, *args, **kwargs)
    if mode == "torn":
        write(torn=where)

pq.write_table = write_table
if mode == "before":
    sys.addaudithook(audit)
save_results(tagged(reference, "new"))
print(writes)
"""


def _origin(columns: pd.Index) -> frozenset[str]:
    return frozenset(c.removeprefix("from_") for c in columns if c.startswith("from_"))


def _tags(out_dir: Path) -> dict[str, frozenset[str] | None]:
    """Each file of a results folder: the evaluations it says it is from (``None``: it does not read, torn)."""
    readers = {"results.json": lambda p: frozenset([json.loads(p.read_text())["exp_name"]]),
               "results.csv": lambda p: _origin(pd.read_csv(p, skiprows=1).columns)}
    tags: dict[str, frozenset[str] | None] = {}
    for path in sorted(out_dir.glob("*.parquet")) + [out_dir / name for name in RESULTS_FILES[1:]]:
        if not path.exists():
            continue
        try:
            tags[path.name] = readers.get(path.name, lambda p: _origin(pd.read_parquet(p).columns))(path)
        except Exception:  # a torn file cannot pass for results
            tags[path.name] = None
    return tags


def _one_evaluation_or_none(out_dir: Path, point: tuple[str, int]) -> None:
    """Nothing reads or loads as results; or every file there is one evaluation's, whole (the 9 of them, loading) once
    ``results.parquet`` is there (before it, ``results.csv`` / ``.json`` may be: written after every other file)."""
    tags = _tags(out_dir)
    if not any(tags.get(name) for name in RESULTS_FILES):
        with pytest.raises(Exception):
            load_results(out_dir)
        return
    origins = set(tags.values())
    assert len(origins) == 1 and None not in origins, (point, tags)  # no mix of two evaluations, nothing torn
    (origin,) = origins
    assert len(origin) == 1, (point, tags)
    if not tags.get("results.parquet"):
        assert len(set(tags) - set(RESULTS_FILES)) == 6, (point, tags)  # every other file, the new one's
        with pytest.raises(FileNotFoundError, match="no evaluation results"):
            load_results(out_dir)
        return
    assert len(tags) == 9, (point, tags)
    loaded = load_results(out_dir)
    assert {loaded.metadata.exp_name} == origin and all(_origin(getattr(loaded, n).columns) == origin for n in FRAMES)


@pytest.mark.parametrize("kills", [SAVE_KILLS, pytest.param(None, marks=pytest.mark.slow)])
def test_results_killed_while_saved_over_earlier_ones_are_one_evaluations_or_none(reference_evaluation, tmp_path,
                                                                                  repo_root, kills):
    """``save_results`` over an earlier evaluation's results, SIGKILLed before a drawn write of the save (a Parquet
    file, the CSV or the JSON) or once a drawn Parquet file is written and cut in half: every results file that reads
    (``results.parquet`` / ``.csv`` / ``.json``) and every other file is one evaluation's, the earlier one's or the new
    one's, or nothing reads as results at all. The negative control: the save not killed leaves the new one's."""
    out_dir, _ = reference_evaluation
    child = _SAVE_CHILD.format(frames=FRAMES)

    def save(target: Path, mode: str, at: int) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", child, str(out_dir), str(target), mode, str(at)], cwd=repo_root,
                              env=_env(), capture_output=True, text=True, timeout=TIMEOUT)

    done = save(tmp_path / "control", "before", 0)
    assert done.returncode == 0, done.stderr[-3000:]
    writes = int(done.stdout.split()[-1])
    assert writes >= 9 and set(_tags(tmp_path / "control").values()) == {frozenset({"new"})}
    assert len(_tags(tmp_path / "control")) == 9
    tables = save(tmp_path / "tables", "torn", 0)
    assert tables.returncode == 0, tables.stderr[-3000:]
    parquet = int(tables.stdout.split()[-1])
    points = [("before", n) for n in range(1, writes + 1)] + [("torn", n) for n in range(1, parquet + 1)]
    if kills is not None:
        points = random.Random(SEED).sample(points, kills)
    for mode, at in points:
        target = tmp_path / f"{mode}{at}"
        result = save(target, mode, at)
        assert result.returncode == -signal.SIGKILL, result.stderr[-3000:]
        _one_evaluation_or_none(target, (mode, at))
