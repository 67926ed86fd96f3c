"""data_gen.regenerate against a fake OpenAI-compatible server (retries, refusals, kill -9 and rerun) and against a
real ``transformers serve`` on the micro target, whose responses data_gen.collect then labels."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import transformers
from hydra import compose, initialize_config_dir
from packaging.version import Version

from ahconf.entry import CONF_DIR, run_entry, to_config
from ahconf.schema import SamplingConfig
from data_gen import serving
from data_gen.collect import collect
from data_gen.regenerate import check, regenerate
from data_gen.responses import meta_path, read_meta, read_rows
from data_gen.serving import completion_body
from data_gen.shards import load_split
from runtime.seeding import prompt_seed

MAX_TOKENS = 12


class FakeServer:
    """``/v1/models`` and ``/v1/completions`` in a thread; a reply is a function of (prompt, seed) unless ``mode``
    says otherwise: ``constant`` (ignores the seed), ``random`` (ignores it the other way), ``not_json``,
    ``no_choices``, ``abort``, ``truncated``, ``too_long``."""

    def __init__(self, models: list[str], *, mode: str = "ok", fail_first: int = 0, delay: float = 0.0) -> None:
        self.models, self.mode, self.fail_first, self.delay = models, mode, fail_first, delay
        self.bodies: list[dict] = []
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                self._send(200, json.dumps({"object": "list", "data": [{"id": m} for m in fake.models]}).encode())

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                time.sleep(fake.delay)
                self._send(*fake.reply(body))

            def _send(self, status: int, payload: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def reply(self, body: dict) -> tuple[int, bytes]:
        with self.lock:
            self.bodies.append(body)
            if len(self.bodies) <= self.fail_first:
                return 503, b'{"error": "warming up"}'
        if self.mode == "not_json":
            return 200, b"<html>oops</html>"
        if self.mode == "no_choices":
            return 200, b'{"choices": []}'
        max_tokens = body["max_tokens"]
        key = {"constant": "", "random": os.urandom(8).hex()}.get(self.mode, body["seed"])
        digest = hashlib.sha256(f"{body['prompt']}/{key}".encode()).digest()
        length = max_tokens if digest[0] % 2 else 1 + digest[1] % max_tokens
        reason = "length" if length == max_tokens else "stop"
        if self.mode in ("abort", "truncated", "too_long"):
            length, reason = {"abort": (length, "abort"), "truncated": (max_tokens - 2, "length"),
                              "too_long": (max_tokens + 1, "length")}[self.mode]
        ids = [b % 50 + 3 for b in (digest * 4)[:length]]
        choice = {"index": 0, "text": " ".join(f"w{i}" for i in ids), "finish_reason": reason, "token_ids": ids}
        usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": length}
        return 200, json.dumps({"object": "text_completion", "choices": [choice], "usage": usage}).encode()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def fake(micro_trio):
    """``fake(**kwargs)`` starts a fake server serving the micro target (closed after the test)."""
    servers: list[FakeServer] = []

    def start(models: list[str] | None = None, **kwargs) -> FakeServer:
        servers.append(FakeServer(models or [str(micro_trio["target"])], **kwargs))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


@pytest.fixture(autouse=True)
def _fast_backoff(monkeypatch) -> None:
    monkeypatch.setattr(serving, "BACKOFF_S", 0.01)


def _overrides(micro_trio: dict[str, Path], root: Path, url: str, *extra: str) -> list[str]:
    return [
        *(f"models.{role}.id={path}" for role, path in micro_trio.items()),
        f"paths.root={root}",
        "prompts.sizes={train: 4, dev: 3}",
        "prompts.max_prompt_tokens=120",
        "prompts.truncation=left",
        f"collect.max_new_tokens={MAX_TOKENS}",
        f"regenerate.servers=[{url}]",
        "regenerate.retries=2",
        *extra,
    ]


def _compose(*overrides: str):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def _job(micro_trio, root, url, *extra):
    return to_config(_compose(*_overrides(micro_trio, root, url, *extra))).regenerate_job()


def _entry(capsys, *overrides: str) -> tuple[int, str, list[str]]:
    """Run the entry point in-process: (exit status, stdout, the stderr lines that are not the progress bar)."""
    def task(config):
        return regenerate(config.regenerate_job())

    try:
        run_entry(_compose(*overrides), "data_gen.regenerate", task, check)
        status = 0
    except SystemExit as exit_:
        status = exit_.code
    captured = capsys.readouterr()
    return status, captured.out, [line for line in captured.err.splitlines() if line and not line.startswith(
        "regenerate:")]


def _by_key(path: Path) -> dict[tuple[str, str], dict]:
    rows = read_rows(path)
    keyed = {(r["split"], r["prompt_id"]): r for r in rows}
    assert len(keyed) == len(rows), "a (split, prompt_id) written twice"
    return keyed


def test_retries_503s_then_writes_every_response_in_the_vllm_dialect(micro_trio, fake, tmp_path, monkeypatch):
    server = fake(fail_first=2)
    waits: list[float] = []
    sleep = time.sleep
    monkeypatch.setattr(serving.time, "sleep", lambda seconds: waits.append(seconds) or sleep(seconds))
    job = _job(micro_trio, tmp_path, server.url, "sampling.top_k=20")
    summary = regenerate(job)
    assert summary.complete and summary.written == 7 and summary.servers[0].retries == 2
    assert [w for w in waits if w] == [0.01, 0.02], "exponential backoff"
    assert summary.prompt_tokens_differ == 0 and summary.prompt_tokens_checked == 7
    rows = _by_key(Path(job.regenerate.out))
    assert sorted({split for split, _ in rows}) == ["dev", "train"] and len(rows) == 7
    meta = read_meta(job.regenerate.out)
    assert meta.complete and meta.engine == "vllm" and meta.served_model == str(micro_trio["target"])
    assert meta.sampling == {"temperature": 1.0, "top_k": 20, "top_p": None} and meta.max_tokens == MAX_TOKENS
    sent = {tuple(b["prompt"]): b for b in server.bodies[2:]}
    for row in rows.values():
        body = sent[tuple(row["prompt_ids"])]
        assert body["seed"] == prompt_seed(0, row["prompt_id"]) and body["max_tokens"] == MAX_TOKENS
        assert (body["top_k"], body["top_p"], body["temperature"]) == (20, 1.0, 1.0) and body["return_token_ids"]
        assert row["response_ids"] and row["finish_reason"] in ("stop", "length") and "prompt" not in row
    assert regenerate(job).resumed == 7, "a rerun of a complete file sends nothing"


def test_each_engine_gets_the_transform_in_its_own_fields():
    sampling = SamplingConfig(temperature=0.7, top_k=None, top_p=0.9)
    vllm = completion_body("vllm", "m", [5, 6], sampling, 12, 3)
    assert (vllm["prompt"], vllm["top_k"], vllm["top_p"], vllm["seed"]) == ([5, 6], -1, 0.9, 3)
    tgi = completion_body("tgi", "m", "x", SamplingConfig(top_p=1.0), 12, 3)
    assert "top_p" not in tgi and "top_k" not in tgi and tgi["temperature"] == 1.0
    hf = completion_body("transformers", "m", "x", sampling, 12, 3)
    assert set(hf) == {"model", "prompt", "max_tokens", "seed", "generation_config"}
    assert json.loads(hf["generation_config"]) == {"do_sample": True, "temperature": 0.7, "top_k": 0, "top_p": 0.9,
                                                   "max_new_tokens": 12, "repetition_penalty": 1.0}
    greedy = completion_body("transformers", "m", "x", SamplingConfig(temperature=0), 12, 3)
    assert json.loads(greedy["generation_config"])["do_sample"] is False


def test_an_unreachable_server_is_one_line_naming_it(micro_trio, tmp_path, capsys):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    status, _, err = _entry(capsys, *_overrides(micro_trio, tmp_path, url, "regenerate.retries=1"))
    assert status == 2 and len(err) == 1
    assert err[0].startswith(f"error: cannot reach {url}") and "vllm serve" in err[0]
    assert not meta_path(tmp_path / "tiny" / "responses.jsonl").exists()


def test_a_server_of_another_model_is_refused(micro_trio, fake, tmp_path, capsys):
    server = fake(models=["meta-llama/Llama-2-7b-hf"])
    status, _, err = _entry(capsys, *_overrides(micro_trio, tmp_path, server.url))
    assert status == 2 and len(err) == 1
    assert "serves meta-llama/Llama-2-7b-hf, not" in err[0] and "regenerate.served_model" in err[0]
    assert not server.bodies


@pytest.mark.parametrize("mode, says", [("not_json", "not JSON"), ("no_choices", "malformed reply"),
                                        ("abort", "finish_reason 'abort'"), ("truncated", "truncated reply"),
                                        ("too_long", "over max_tokens")])
def test_a_malformed_or_truncated_reply_is_one_line_and_nothing_is_marked_complete(micro_trio, fake, tmp_path,
                                                                                 capsys, mode, says):
    server = fake(mode=mode)
    status, _, err = _entry(capsys, *_overrides(micro_trio, tmp_path, server.url, "sampling.temperature=0"))
    assert status == 2 and len(err) == 1 and says in err[0]
    assert re.search(r"prompt (train|dev)/\S+ on " + re.escape(server.url), err[0])
    out = tmp_path / "tiny" / "responses.jsonl"
    assert not read_meta(out).complete and not read_rows(out)


@pytest.mark.parametrize("mode, says", [("constant", "is not sampling"), ("random", "ignores per-request seeds")])
def test_the_probe_refuses_a_server_that_does_not_sample_by_seed(micro_trio, fake, tmp_path, capsys, mode, says):
    server = fake(mode=mode)
    status, _, err = _entry(capsys, *_overrides(micro_trio, tmp_path, server.url))
    assert status == 2 and len(err) == 1 and says in err[0] and server.url in err[0]
    assert not meta_path(tmp_path / "tiny" / "responses.jsonl").exists()


def test_a_file_of_another_config_is_refused(micro_trio, fake, tmp_path, capsys):
    server = fake()
    regenerate(_job(micro_trio, tmp_path, server.url))
    status, _, err = _entry(capsys, *_overrides(micro_trio, tmp_path, server.url, "seed=1"))
    assert status == 2 and len(err) == 1 and "belongs to another config (seed: 0 there, 1 here)" in err[0]


def test_configs_are_checked_offline(capsys):
    status, out, _ = _entry(capsys, "+exp=llama70b", "regenerate.servers=[http://node1:8000]",
                            "regenerate.engine=vllm", "dry_run=true")
    assert status == 0 and "dry run: config 'llama70b' is valid" in out and "top_k: 50" in out
    status, _, err = _entry(capsys, "+exp=llama70b", "dry_run=true")
    assert status == 2 and len(err) == 1 and "regenerate.servers=[http://host:8000]" in err[0]
    status, _, err = _entry(capsys, "+exp=llama70b", "regenerate.servers=[http://node1:8000]", "regenerate.engine=tgi",
                         "dry_run=true")
    assert status == 2 and len(err) == 1 and "takes no top_k" in err[0]


def test_sigkill_mid_run_then_rerun_loses_and_duplicates_nothing(micro_trio, fake, tmp_path):
    server = fake(delay=0.1)
    killed = tmp_path / "killed"
    overrides = _overrides(micro_trio, killed, server.url, "prompts.sizes={train: 24, dev: 4}",
                           "regenerate.concurrency=2")
    process = subprocess.Popen([sys.executable, "-m", "data_gen.regenerate", *overrides], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    out = killed / "tiny" / "responses.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and (not out.exists() or out.read_bytes().count(b"\n") < 4):
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert 4 <= out.read_bytes().count(b"\n") < 28, "the kill must land mid-run"
    assert not read_meta(out).complete
    resumed = regenerate(to_config(_compose(*overrides)).regenerate_job())
    assert resumed.complete and resumed.resumed >= 4
    reference = _job(micro_trio, tmp_path / "reference", server.url, "prompts.sizes={train: 24, dev: 4}")
    regenerate(reference)
    rows, expected = _by_key(out), _by_key(Path(reference.regenerate.out))
    assert rows.keys() == expected.keys() and len(rows) == 28
    assert all(rows[key]["response"] == expected[key]["response"] for key in rows)
    assert read_meta(out).complete


#: The first transformers whose ``serve`` lists a model it was started with by path (``GET /v1/models``).
SERVE_LISTS_PATHS = "5.24"


@pytest.fixture
def transformers_serve(micro_trio, tmp_path):
    """``transformers serve`` on the micro target, on a free port (killed after the test)."""
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    if Version(transformers.__version__) < Version(SERVE_LISTS_PATHS):
        pytest.skip(f"transformers serve lists a model given by path from {SERVE_LISTS_PATHS} on (before: only "
                    "hub-cached ones, so data_gen.regenerate cannot check what it serves); the [dev] extra installs it")
    executable = shutil.which("transformers", path=str(Path(sys.executable).parent))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = (tmp_path / "serve.log").open("w")
    process = subprocess.Popen([executable, "serve", "--host", "127.0.0.1", "--port", str(port), "--device", "cpu",
                                str(micro_trio["target"])], stdout=log, stderr=subprocess.STDOUT,
                               env={**os.environ, "HF_HUB_OFFLINE": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 90
        while True:
            assert process.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            assert time.time() < deadline, "transformers serve did not answer /health in 90 s"
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.5)
        yield url
    finally:
        process.kill()
        process.wait()
        log.close()


def test_transformers_serve_regenerates_and_collect_labels_the_responses(micro_trio, transformers_serve, tmp_path):
    extra = ["regenerate.engine=transformers", "collect.splits=[dev]", "prompts.sizes={train: 4, dev: 4}"]
    outs = {}
    for name, seed, concurrency in (("seed0", 0, 1), ("seed0_again", 0, 1), ("seed1", 1, 4)):
        job = _job(micro_trio, tmp_path, transformers_serve, *extra, f"seed={seed}",
                   f"regenerate.concurrency={concurrency}", f"regenerate.out={tmp_path / f'{name}.jsonl'}")
        summary = regenerate(job)
        assert summary.complete and summary.written == 4 and summary.prompt_tokens_differ == 0
        outs[name] = _by_key(Path(job.regenerate.out))
        meta = read_meta(job.regenerate.out)
        assert meta.complete and meta.engine == "transformers" and meta.seed == seed
        for row in outs[name].values():
            assert row["prompt"] and row["usage_prompt_tokens"] == len(row["prompt_ids"]) and "response_ids" not in row
    # one request at a time, a prompt's seed fixes its response (in flight together, the server's global seed races)
    assert outs["seed0"] == outs["seed0_again"]
    assert len({row["response"] for out in outs.values() for row in out.values()}) >= 7

    config = to_config(_compose(*_overrides(micro_trio, tmp_path, transformers_serve, *extra,
                                            f"responses={tmp_path / 'seed0.jsonl'}")))
    manifest = collect(config.collect_job())
    labelled = load_split(Path(config.paths.data_dir), "dev")
    assert {r["prompt_id"]: r["prompt_ids"] for r in labelled} == {
        key[1]: row["prompt_ids"] for key, row in outs["seed0"].items()}
    sampled = manifest.splits["dev"]["sampling_check"]
    assert sampled["passed"] and sampled["outside_support"] == 0
