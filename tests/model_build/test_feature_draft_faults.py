"""kill -9 fault tests of the feature-draft build (issue 77, item 3): every stage of ``python -m
model_build.feature_draft`` resumes without a repeated or skipped shard or step.

The build is run as a subprocess on a micro target (CPU only) and SIGKILLed inside one stage at a seeded-random moment,
found by the files it writes: a response shard being generated (after the shard before it was finished, before its
own file appears), a teacher shard being computed (after its response shard appeared, before its own file), training
between two checkpoints (after one ``last.ckpt`` write, before the next), and the draft directory's save (at a seeded
point, killed from inside by a wrapper of the command). The moment is a seeded fraction of that stage's duration as
measured on an earlier shard or checkpoint interval; there the process is stopped (SIGSTOP) and killed only if it is
still inside the stage, else it runs on and the next shard or interval is tried (so a kill that lands is known to have
landed where it was meant to). Then the same command runs again, and the end is compared with an uninterrupted build's:
the same shard files with the same content (none made twice: a finished shard keeps its inode), a training resumed at
its checkpoint's step (its step lines start right after it) that ends at the reference's step count with the
reference's trained tensors bit for bit, and the same draft directory. After every kill no draft directory looks
complete unless it is (:func:`decode.artifacts.hub.check_recorded_files`), and ``last.ckpt`` was only ever replaced by
a new file renamed over it, never rewritten in place (the builds' ``$TMPDIR`` is on another filesystem where the
machine has one, /dev/shm, as where Lightning's own write would copy a checkpoint over the last one).

``trained.safetensors`` is compared by its tensors and metadata, not by its sha256: safetensors writes a header's
metadata (two keys here) in a per-process hash order, so two builds of the same tensors differ in their header bytes.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

#: kills per stage: the default run makes one in each stage, all in one build (a kill in the responses stage, the
#: rerun killed in the teacher stage, its rerun in training, its rerun in the save, then a run to the end); the slow
#: loop makes this many in one stage per build, for each stage (then, for the save, one while replacing a draft).
KILLS_PER_STAGE = 1
KILLS_PER_STAGE_SLOW = 3
STAGES = ("responses", "teacher", "training", "save")
SEED = 77  # of the kill moments

SHARDS, PROMPTS_PER_SHARD, STEPS, CHECKPOINT_EVERY = 6, 12, 12, 2
RUN_TIMEOUT = 150  # seconds one run of the command may take before it is counted as hung (one takes ~10)
POLL = 0.002  # seconds between looks at the files
FIRST_GUESS = 0.1  # seconds a stage is guessed to take before one was measured
RECORD = "feature_draft.json"
SAVE_POINTS = ("model.safetensors", "trained.safetensors", RECORD)  # the save is killed right after writing one
REPLACING = "unlink"  # the save is killed at its first file removal after the staging record was written
#: CPU only, one thread: the same kernels in every run, and no two-thread barrier stalled by the machine's other load
ENV = {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
#: a temp directory on another filesystem than the build's (None: there is none), the build's $TMPDIR: Lightning
#: stages a checkpoint there, so it would copy it over ``last.ckpt`` in place were it not written beside it
OTHER_TMPDIR: Path | None = None
STEP_LINE = re.compile(r"^step (\d+)/(\d+):", re.MULTILINE)

#: Runs the command with a SIGKILL at one point of the draft directory's save (``sys.argv[1]``).
SAVE_KILLER = '''
import os, runpy, signal, sys
from pathlib import Path

point = sys.argv.pop(1)
import model_build.feature_draft.build as build

armed = False
real_save_file, real_write_json, real_unlink = build.save_file, build.write_json, os.unlink


def die():
    sys.stdout.flush(); sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def save_file(tensors, path, *args, **kwargs):
    real_save_file(tensors, path, *args, **kwargs)
    if Path(path).name == point:
        die()


def write_json(path, data, *args, **kwargs):
    global armed
    real_write_json(path, data, *args, **kwargs)
    if Path(path).name == "feature_draft.json":
        if point == "feature_draft.json":
            die()
        armed = True


def unlink(path, *args, **kwargs):
    real_unlink(path, *args, **kwargs)
    if armed and point == "unlink":
        die()


build.save_file, build.write_json, os.unlink = save_file, write_json, unlink
sys.argv[0] = "model_build.feature_draft"
runpy.run_module("model_build.feature_draft", run_name="__main__", alter_sys=True)
'''


def shard_name(kind: str, index: int) -> str:
    return f"{kind}-{index:05d}.safetensors"


def arguments(target: Path, root: Path) -> list[str]:
    """A small build with every stage: 6 shards of 12 prompts, 8 response tokens, 12 training steps of 256 tokens
    checkpointed every 2."""
    return ["--target", str(target), "--out", str(root / "draft"), "--shards", str(SHARDS),
            "--prompts-per-shard", str(PROMPTS_PER_SHARD), "--response-tokens", "8", "--temperatures", "1",
            "--generation-batch", "8", "--steps", str(STEPS), "--tokens-per-step", "256",
            "--checkpoint-every", str(CHECKPOINT_EVERY), "--held-out-sequences", "4", "--layers", "1", "--unroll", "2",
            "--vocab-subset", "64", "--dtype", "float32", "--seed", "0"]


def file_identity(path: Path) -> tuple[int, int, int]:
    stat = path.stat()
    return stat.st_ino, stat.st_mtime_ns, stat.st_size


def checkpoint_step(path: Path) -> int:
    import torch

    return int(torch.load(path, map_location="cpu", weights_only=False)["global_step"])


def shard_content(path: Path) -> tuple[dict, dict]:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as handle:
        return handle.metadata() or {}, {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118


def same_content(one: tuple[dict, dict], other: tuple[dict, dict]) -> bool:
    import torch

    return (one[0] == other[0] and one[1].keys() == other[1].keys()
            and all(one[1][name].dtype == other[1][name].dtype and torch.equal(one[1][name], other[1][name])
                    for name in one[1]))


def tensors_digest(path: Path) -> tuple[dict, str]:
    """A safetensors file's metadata and the sha256 of its tensors in name order (its header's order aside)."""
    from decode.digests import tensors_sha256

    metadata, tensors = shard_content(path)
    return metadata, tensors_sha256(sorted(tensors.items()))


def complete_or_absent(out: Path) -> str | None:
    """None where ``out`` is absent, or complete by its record; else what is wrong with it."""
    from decode.artifacts.hub import ModelLoadError, check_recorded_files

    if not out.exists():
        return None
    if not (out / RECORD).is_file():
        return f"{out} exists without its {RECORD}"
    try:
        check_recorded_files(out)
    except ModelLoadError as error:
        return str(error)
    return None


class Run:
    """One run of the command, watched through the files it writes (shards, ``last.ckpt``, the draft directory)."""

    def __init__(self, command: list[str], root: Path, name: str, runs: list[Run]) -> None:
        self.root, self.data = root, root / "draft.data"
        self.checkpoint = root / "draft.work" / "checkpoints" / "last.ckpt"
        self.log = root / f"{name}.log"
        self.initial = set(self.shards())
        self.held = None  # the checkpoint last seen, kept open: its inode number cannot be reused while it is
        self.rewritten_in_place = 0  # checkpoint writes into the file before (not a new file renamed over it)
        self.initial_checkpoint = self.checkpoint_version()
        self.seen: dict[str, float] = {}  # shard file -> when it was first seen
        self.writes: list[tuple[tuple[int, int, int], float]] = []  # checkpoint writes seen: (identity, when)
        with self.log.open("wb") as log:
            env = {**os.environ, **ENV, **({"TMPDIR": str(OTHER_TMPDIR)} if OTHER_TMPDIR else {})}
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                            cwd=Path(__file__).resolve().parents[2])
        runs.append(self)
        self.deadline = time.monotonic() + RUN_TIMEOUT

    def shards(self) -> list[str]:
        return [e.name for e in os.scandir(self.data) if not e.name.startswith(".")] if self.data.is_dir() else []

    def checkpoint_version(self) -> tuple[int, int, int] | None:
        """The checkpoint's (inode, mtime, size), that file held open until the next is seen."""
        try:
            handle = self.checkpoint.open("rb")
        except FileNotFoundError:
            return None
        stat = os.fstat(handle.fileno())
        version = stat.st_ino, stat.st_mtime_ns, stat.st_size
        if self.held is not None:
            held, seen = self.held
            if seen == version:
                handle.close()
                return version
            if seen[0] == version[0]:
                self.rewritten_in_place += 1
            held.close()
        self.held = handle, version
        return version

    def poll(self) -> bool:
        """Note what appeared; whether the process still runs."""
        now = time.monotonic()
        for name in self.shards():
            if name not in self.initial:
                self.seen.setdefault(name, now)
        version = self.checkpoint_version()
        if version is not None and version != self.initial_checkpoint and (
                not self.writes or self.writes[-1][0] != version):
            self.writes.append((version, now))
        if time.monotonic() > self.deadline:
            raise TimeoutError(f"a run took over {RUN_TIMEOUT} s; its output: {self.log}")
        return self.process.poll() is None

    def wait_until(self, done: Callable[[], bool]) -> bool:
        """Poll until ``done`` (True) or the process ended (False)."""
        while not done():
            if not self.poll():
                self.poll()
                return done()
            time.sleep(POLL)
        return True

    def sleep_until(self, moment: float) -> None:
        while time.monotonic() < moment and self.poll():
            time.sleep(POLL)

    def kill_if(self, inside: Callable[[], bool]) -> bool:
        """Stop the process, look, and SIGKILL it where it is still ``inside`` the stage; else let it run on."""
        try:
            os.kill(self.process.pid, signal.SIGSTOP)
        except ProcessLookupError:
            return False
        killed = False
        try:
            alive = self.poll()
            if alive and inside():
                os.kill(self.process.pid, signal.SIGKILL)
                killed = True
                self.process.wait(timeout=60)
        finally:
            if not killed and self.process.poll() is None:
                os.kill(self.process.pid, signal.SIGCONT)
        return killed

    def finish(self) -> int:
        """Wait for the process to end by itself; its return code."""
        self.wait_until(lambda: False)
        return self.process.wait(timeout=60)

    def close(self) -> None:
        if self.held is not None:
            self.held[0].close()

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def steps(self) -> list[int]:
        """The steps its step lines name (every ``CHECKPOINT_EVERY`` steps it trained)."""
        return [int(step) for step, _ in STEP_LINE.findall(self.output())]


def windows(run: Run, stage: str) -> list[float]:
    """The durations of ``stage`` this run showed in full: per shard, or between checkpoint writes."""
    if stage == "training":
        return [b[1] - a[1] for a, b in zip(run.writes, run.writes[1:])]
    found = []
    for index in range(SHARDS):
        start, end = stage_markers(stage, index)
        if start in run.seen and end in run.seen:
            found.append(run.seen[end] - run.seen[start])
    return found


def stage_markers(stage: str, index: int) -> tuple[str, str]:
    """The files whose appearance starts and ends shard ``index``'s ``stage`` (``--stage all`` makes shard ``i``'s
    responses then its teacher shard, then shard ``i + 1``'s)."""
    if stage == "responses":
        return shard_name("teacher", index - 1), shard_name("responses", index)
    return shard_name("responses", index), shard_name("teacher", index)


@dataclass
class Kills:
    """Seeded kill moments, and the stage durations measured last (the moment is a fraction of one)."""

    rng: random.Random
    durations: dict[str, list[float]] = field(default_factory=dict)  # per stage: the latest run's that showed any
    misses: int = 0  # tries where the process had left the stage by the chosen moment (it ran on)

    def learn(self, run: Run) -> None:
        for stage in ("responses", "teacher", "training"):
            self.durations[stage] = windows(run, stage) or self.durations.get(stage, [])

    def delay(self, stage: str, run: Run) -> float:
        """A seeded fraction of the stage's duration: this run's, else the latest run's (the load of the machine
        changes its speed from run to run)."""
        measured = windows(run, stage) or self.durations.get(stage, [])
        return self.rng.uniform(0.1, 0.9) * (statistics.median(measured) if measured else FIRST_GUESS)

    def skip(self, candidates: int) -> int:
        """Windows passed over before the first try (which shard or interval), keeping room for retries."""
        return self.rng.randrange(2) if candidates >= 4 else 0


def kill_in_shard_stage(run: Run, stage: str, kills: Kills) -> int:
    """SIGKILL ``run`` while it generates a response shard / computes a teacher shard; the shard's index."""
    candidates = [i for i in range(SHARDS) if (stage == "teacher" or i >= 1)
                  and not {*stage_markers(stage, i)} & run.initial]  # both of its files still to be made by this run
    for index in candidates[kills.skip(len(candidates)):]:
        start, end = stage_markers(stage, index)
        if not run.wait_until(lambda: start in run.seen):
            break
        if end in run.seen:
            continue  # over before it was seen: the next shard
        run.sleep_until(run.seen[start] + kills.delay(stage, run))
        if run.kill_if(lambda: end not in run.seen):
            return index
        kills.misses += 1
    pytest.fail(f"no kill landed in the {stage} stage (candidates {candidates}); its output: {run.log}")


def kill_in_training(run: Run, kills: Kills, resumed_at: int) -> int:
    """SIGKILL ``run`` (resumed at step ``resumed_at``) between two checkpoint writes; the step of the checkpoint it
    leaves."""
    passed = kills.skip((STEPS - resumed_at) // CHECKPOINT_EVERY - 1)  # the intervals between its writes
    start = 0  # the writes seen when the interval tried began (its start: the last of them)
    while True:
        if not run.wait_until(lambda: len(run.writes) > start):
            break
        start = len(run.writes)  # after a miss: the write that ended the missed interval starts the next
        if checkpoint_step(run.checkpoint) >= STEPS:
            break  # the last checkpoint: training is over
        if passed:
            passed -= 1
            continue
        run.sleep_until(run.writes[-1][1] + kills.delay("training", run))
        if run.kill_if(lambda: len(run.writes) == start and not (run.root / ".draft.partial").exists()
                       and not (run.root / "draft").exists()):
            return checkpoint_step(run.checkpoint)
        kills.misses += 1
    pytest.fail(f"no kill landed between two checkpoints; its output: {run.log}")


@dataclass
class Reference:
    """The uninterrupted build."""

    root: Path
    shards: dict[str, tuple[dict, dict]]
    record: dict
    trained: tuple[dict, str]
    steps: list[int]
    kills: Kills


@pytest.fixture(scope="module", autouse=True)
def _tmpdir_on_another_filesystem(tmp_path_factory):
    """The builds' $TMPDIR on another filesystem than their directories (/dev/shm), where this machine has one."""
    global OTHER_TMPDIR
    import shutil
    import tempfile

    shm, base = Path("/dev/shm"), tmp_path_factory.getbasetemp()
    if not shm.is_dir() or not os.access(shm, os.W_OK) or shm.stat().st_dev == base.stat().st_dev:
        yield
        return
    OTHER_TMPDIR = Path(tempfile.mkdtemp(prefix="feature-draft-faults-", dir=shm))
    try:
        yield
    finally:
        shutil.rmtree(OTHER_TMPDIR, ignore_errors=True)
        OTHER_TMPDIR = None


@pytest.fixture(scope="module")
def target(micro_trio, tmp_path_factory) -> Path:
    """The micro target with a chat template (the build renders its prompts as chats)."""
    import shutil

    from transformers import AutoTokenizer

    path = tmp_path_factory.mktemp("faults") / "target"
    shutil.copytree(micro_trio["target"], path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                               "{% if add_generation_prompt %}assistant: {% endif %}")
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def save_killer(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("save_killer") / "save_killer.py"
    path.write_text(SAVE_KILLER)
    return path


@pytest.fixture(scope="module")
def reference(target, tmp_path_factory) -> Reference:
    root = tmp_path_factory.mktemp("reference")
    runs: list[Run] = []
    try:
        command = [sys.executable, "-m", "model_build.feature_draft", *arguments(target, root)]
        run = Run(command, root, "reference", runs)
        assert run.finish() == 0, run.output()[-3000:]
    finally:
        stop(runs)
    assert run.steps() == list(range(CHECKPOINT_EVERY, STEPS + 1, CHECKPOINT_EVERY))  # its step lines are read
    assert len(run.writes) >= 3, "training must checkpoint often enough for a kill between two checkpoints"
    assert run.rewritten_in_place == 0, "last.ckpt was rewritten in place (a kill then truncates it)"
    kills = Kills(random.Random(SEED))
    kills.learn(run)
    data = root / "draft.data"
    record = json.loads((root / "draft" / RECORD).read_text())
    return Reference(root, {p.name: shard_content(p) for p in sorted(data.iterdir()) if not p.name.startswith(".")},
                     record, tensors_digest(root / "draft" / "trained.safetensors"), run.steps(), kills)


def stop(runs: list[Run]) -> None:
    """SIGKILL whatever run is still going (a failed test's)."""
    for run in runs:
        if run.process.poll() is None:
            run.process.kill()
            run.process.wait(timeout=60)
        run.close()


class Build:
    """One build directory taken through kills to the end, checked against the reference after every run."""

    def __init__(self, target: Path, root: Path, save_killer: Path, reference: Reference, seed: int) -> None:
        self.args = arguments(target, root)
        self.command = [sys.executable, "-m", "model_build.feature_draft", *self.args]
        self.killer = [sys.executable, str(save_killer)]
        self.root, self.reference, self.out = root, reference, root / "draft"
        self.kills = Kills(random.Random(seed), {k: list(v) for k, v in reference.kills.durations.items()})
        self.runs: list[Run] = []
        self.identities: dict[str, tuple[int, int, int]] = {}  # a finished shard's file: it is never made again
        self.checkpoint: int | None = None  # the step of the checkpoint the last run left
        self.save_points = self.kills.rng.sample(SAVE_POINTS, len(SAVE_POINTS))  # a seeded order, each in turn

    def kill_in(self, stage: str) -> str:
        """One run of the command killed inside ``stage``; where it landed."""
        existed = self.out.exists()
        if stage == "save":
            point = REPLACING if existed else self.save_points.pop(0)
            run = Run([*self.killer, point, *self.args], self.root, f"run{len(self.runs)}-save", self.runs)
            code = run.finish()
            assert code == -signal.SIGKILL, f"the save was not killed at {point} (exit {code}): {run.output()[-3000:]}"
            landed = f"save after {point}"
        elif stage == "training":
            run = Run(self.command, self.root, f"run{len(self.runs)}-training", self.runs)
            landed = f"training after the checkpoint of step {kill_in_training(run, self.kills, self.checkpoint or 0)}"
        else:
            run = Run(self.command, self.root, f"run{len(self.runs)}-{stage}", self.runs)
            index = kill_in_shard_stage(run, stage, self.kills)
            start, end = stage_markers(stage, index)
            assert start in run.shards() and end not in run.shards(), f"{stage} of shard {index}: killed outside it"
            landed = f"{stage} of shard {index}"
        self.kills.learn(run)
        self.check(run, landed)
        if stage == "training":
            assert {shard_name("teacher", i) for i in range(SHARDS)} <= set(run.shards()), landed
            assert self.checkpoint is not None and 0 < self.checkpoint < STEPS, f"{landed}: not mid-training"
        if not existed:
            assert not self.out.exists(), f"{landed}: a killed build left {self.out}"
        return landed

    def complete(self) -> None:
        """The same command, run to its end."""
        run = Run(self.command, self.root, f"run{len(self.runs)}-rerun", self.runs)
        assert run.finish() == 0, run.output()[-3000:]
        self.check(run, "the rerun")
        self.check_finished(run)

    def check(self, run: Run, landed: str) -> None:
        """What any run leaves: the reference's shards, none made twice; no draft directory that looks complete
        unless it is; steps trained from the step of the checkpoint the run before left, none twice, none skipped."""
        reference, data = self.reference, self.root / "draft.data"
        names = run.shards()
        assert set(names) <= reference.shards.keys(), f"{landed}: shards the reference has not: {names}"
        for name in names:
            assert same_content(shard_content(data / name), reference.shards[name]), f"{landed}: {name} differs"
            identity = file_identity(data / name)
            assert self.identities.setdefault(name, identity) == identity, f"{landed}: {name} was made again"
        problem = complete_or_absent(self.out)
        assert problem is None, f"{landed}: a draft directory that looks complete is not: {problem}"
        assert run.rewritten_in_place == 0, f"{landed}: last.ckpt was rewritten in place (a kill then truncates it)"
        before, steps = self.checkpoint, run.steps()
        after = checkpoint_step(run.checkpoint) if run.checkpoint.is_file() else None
        if steps:  # every CHECKPOINT_EVERY-th step it took, from the first after the checkpoint it resumed from
            assert steps == list(range((before or 0) + CHECKPOINT_EVERY, steps[-1] + 1, CHECKPOINT_EVERY)), \
                f"{landed}: trained steps {steps} after the checkpoint of step {before}"
            assert after in (steps[-1], steps[-1] - CHECKPOINT_EVERY), f"{landed}: checkpoint {after} after {steps}"
        else:
            assert after == before, f"{landed}: the checkpoint moved from step {before} to {after} without a step"
        self.checkpoint = after

    def check_finished(self, run: Run) -> None:
        """The end is the uninterrupted build's: shards, steps, trained tensors and every other file."""
        reference, record = self.reference, json.loads((self.out / RECORD).read_text())
        assert sorted(run.shards()) == sorted(reference.shards)
        assert self.checkpoint == record["training"]["steps"] == reference.record["training"]["steps"] == STEPS
        for key in ("recipe", "data", "training", "params", "training_precision", "target_sha256"):
            assert record[key] == reference.record[key], key
        assert tensors_digest(self.out / "trained.safetensors") == reference.trained  # the same trained bits
        assert record["files"].keys() == reference.record["files"].keys()
        for name, digest in record["files"].items():
            assert name == "trained.safetensors" or digest == reference.record["files"][name], name
        assert [p.name for p in self.root.iterdir() if p.name.startswith(".draft")] == []  # nothing left staged


@pytest.mark.slow  # six build processes, about 95 s on 2 cores: the default run keeps the in-process save test
def test_one_kill_in_each_stage_resumes_without_a_repeated_or_skipped_shard_or_step(target, save_killer, reference,
                                                                                    tmp_path):
    build = Build(target, tmp_path, save_killer, reference, SEED)
    try:
        landed = [build.kill_in(stage) for stage in STAGES for _ in range(KILLS_PER_STAGE)]
        assert [where.split(" ")[0] for where in landed] == [s for s in STAGES for _ in range(KILLS_PER_STAGE)]
        build.complete()
    finally:
        stop(build.runs)
    print("kills landed:", "; ".join(landed), f"({build.kills.misses} tries missed their stage and ran on)")


@pytest.mark.slow
@pytest.mark.parametrize("stage", STAGES)
def test_repeated_kills_in_one_stage_resume_without_a_repeated_or_skipped_shard_or_step(target, save_killer, reference,
                                                                                       tmp_path, stage):
    build = Build(target, tmp_path, save_killer, reference, SEED + STAGES.index(stage) + 1)
    try:
        landed = [build.kill_in(stage) for _ in range(KILLS_PER_STAGE_SLOW)]
        build.complete()
        if stage == "save":  # then a build over the finished draft, killed while it replaces it
            landed.append(build.kill_in("save"))
            assert landed[-1].endswith(REPLACING)
            build.complete()
    finally:
        stop(build.runs)
    print("kills landed:", "; ".join(landed), f"({build.kills.misses} tries missed their stage and ran on)")


class Killed(BaseException):
    """The stand-in for a SIGKILL inside the process."""


def test_a_save_killed_while_it_replaces_a_draft_never_leaves_a_complete_looking_one(micro_feature_draft, tmp_path,
                                                                                     monkeypatch):
    from transformers import AutoTokenizer

    from decode.drafts.feature_model import FeatureDraftForCausalLM
    from model_build.feature_draft import build

    draft = FeatureDraftForCausalLM.from_pretrained(micro_feature_draft)
    tokenizer = AutoTokenizer.from_pretrained(micro_feature_draft)
    out = tmp_path / "draft"
    build.save_draft(draft, tokenizer, out, {"build": 1})
    assert complete_or_absent(out) is None
    armed, real_write_json, real_unlink = [], build.write_json, os.unlink

    def write_json(path, data):
        real_write_json(path, data)
        armed.append(path)

    def unlink(path, *args, **kwargs):
        real_unlink(path, *args, **kwargs)
        if armed:
            raise Killed

    with monkeypatch.context() as patch:
        patch.setattr(build, "write_json", write_json)
        patch.setattr(os, "unlink", unlink)
        with pytest.raises(Killed):
            build.save_draft(draft, tokenizer, out, {"build": 2})
    assert complete_or_absent(out) is None  # the old draft or the new one, whole, or none
    build.save_draft(draft, tokenizer, out, {"build": 3})  # the rerun cleans up what the killed save left
    assert complete_or_absent(out) is None and json.loads((out / RECORD).read_text())["build"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["draft"]
