"""``python -m data_gen.regenerate regenerate.servers=[http://host:8000] [overrides]``: target responses from servers.

Sends the run's prompts (the token ids :func:`data_gen.prompts.split_prompts` gives the collection)
to OpenAI-compatible servers that serve the target (``POST /v1/completions``), each under the run's
sampling transform, ``collect.max_new_tokens`` and the per-prompt seed
:func:`runtime.seeding.prompt_seed`. Prompts are dealt round-robin across ``regenerate.servers``,
``regenerate.concurrency`` requests in flight per server. The replies go to ``regenerate.out``, the
responses file :mod:`data_gen.responses` describes and ``python -m data_gen.collect responses=PATH``
labels; its sidecar says ``complete`` only once every prompt of every split has its response.

Before anything is sent, every server must list the served model (``GET /v1/models``) and, at a
temperature above 0, must really sample: one prompt under several seeds gives different responses,
and under one seed twice the same. Each row is fsynced as it arrives: a run killed at any moment
(``kill -9`` included) and run again loses and duplicates nothing.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import hydra
from omegaconf import DictConfig
from rich.console import Console
from rich.table import Table
from tqdm.auto import tqdm
from transformers import AutoConfig, PreTrainedTokenizerBase

from ahconf.entry import CONF_DIR, run_entry
from ahconf.schema import Config, ConfigError, RegenerateJob
from data_gen.prompts import check_prompt_choices, split_prompts
from data_gen.responses import ResponsesMeta, ResponsesWriter, meta_path, read_meta, write_meta
from data_gen.serving import TEXT_ENGINES, Completion, Server, ServerError, check_engine, completion_body, one_line
from decode.artifacts.hub import ModelLoadError, load_tokenizer, tokenizer_hash
from decode.json_types import JSONDict
from decode.sampling import Sampling
from runtime.encoding import EncodedPrompt
from runtime.models import resolve_model_id
from runtime.seeding import prompt_seed

PROBE_SEEDS = 4  # the sampling probe asks one prompt under this many seeds ...
PROBE_TOKENS = 32  # ... for at most this many tokens each
NOT_SAMPLING_FIX = {
    "transformers": "transformers serve samples as each request's generation_config says (this client sends "
                    "do_sample and the transform there), except when started with --continuous-batching, which "
                    "applies the first request's settings to all: restart it without that flag",
}
SHARED_SEED_NOTE = ("warning: transformers serve seeds through one global torch seed, so with "
                    "regenerate.concurrency > 1 a response does not follow from its prompt's seed (it is still a "
                    "sample of the transform); set regenerate.concurrency=1 for reproducible responses")
SEED_FIX = {
    "sglang": "SGLang applies per-request seeds only when started with --enable-deterministic-inference",
    "transformers": "transformers serve ignores per-request seeds under --continuous-batching: restart it "
                    "without that flag",
}


def check(config: Config) -> None:
    """What needs no server: prompt choices, at least one server, a transform the engine can express."""
    check_prompt_choices(config)
    if not config.regenerate.servers:
        raise ConfigError("regenerate.servers is empty: name the servers that serve the target, e.g. "
                          "regenerate.servers=[http://host:8000]")
    check_engine(config.regenerate.engine, config.sampling)


@dataclass(frozen=True)
class Request:
    """One prompt to send: its split, our token ids, the text a text engine is sent, its seed."""

    split: str
    prompt: EncodedPrompt
    text: str | None
    seed: int

    @property
    def key(self) -> tuple[str, str]:
        return self.split, self.prompt.prompt_id

    @property
    def where(self) -> str:
        return f"prompt {self.split}/{self.prompt.prompt_id}"


@dataclass(frozen=True)
class ResponseRow:
    """One line of the responses file (:mod:`data_gen.responses`); absent fields are left out."""

    split: str
    prompt_id: str
    prompt: str | None
    prompt_ids: list[int]
    response: str
    response_ids: list[int] | None
    finish_reason: str
    usage_prompt_tokens: int | None

    @classmethod
    def of(cls, request: Request, completion: Completion) -> ResponseRow:
        return cls(request.split, request.prompt.prompt_id, request.text, request.prompt.token_ids, completion.text,
                   completion.token_ids, completion.finish_reason, completion.prompt_tokens)

    def to_dict(self) -> JSONDict:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass
class ServerStats:
    """What one server did in this run."""

    url: str
    sent: int = 0
    written: int = 0
    tokens: int = 0
    retries: int = 0


@dataclass
class RegenerateSummary:
    """What a run found and did; printed as the end-of-run table."""

    out: Path
    prompts: dict[str, int]  # per split
    skipped: dict[str, dict[str, int]]  # per split: prompts split_prompts skipped, by reason
    resumed: int  # responses already in the file
    servers: list[ServerStats] = field(default_factory=list)
    seconds: float = 0.0
    prompt_tokens_checked: int = 0  # rows whose server reported usage.prompt_tokens ...
    prompt_tokens_differ: int = 0  # ... and of those, rows where it is not len(prompt_ids)
    complete: bool = False

    @property
    def written(self) -> int:
        return sum(s.written for s in self.servers)

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.servers)


def target_context(path: str, revision: str | None) -> int:
    """The target's context window from its config (no weights loaded)."""
    try:
        config = AutoConfig.from_pretrained(path, revision=revision)
    except (OSError, ValueError) as error:
        raise ModelLoadError(f"cannot read the target's config from {path} ({one_line(str(error))}); pass a local "
                             "directory or a hub id that is in the local cache") from None
    return int(getattr(config, "max_position_embeddings", 10**9))


def plan(job: RegenerateJob, tokenizer: PreTrainedTokenizerBase, context: int,
         ) -> tuple[list[Request], dict[str, dict[str, int]]]:
    """Every split's prompts as requests (the collection's token ids), and what ``split_prompts`` skipped."""
    as_text = job.regenerate.engine in TEXT_ENGINES
    requests: list[Request] = []
    skipped: dict[str, dict[str, int]] = {}
    for split in job.collect.splits:
        encoded, skipped[split] = split_prompts(job.prompts, split, seed=job.seed, tokenizer=tokenizer,
                                                context=context, max_new_tokens=job.collect.max_new_tokens)
        for prompt in encoded:
            text = tokenizer.decode(prompt.token_ids, skip_special_tokens=True) if as_text else None
            requests.append(Request(split, prompt, text, prompt_seed(job.seed, prompt.prompt_id)))
    return requests, skipped


def check_output(out: Path, meta: ResponsesMeta) -> ResponsesMeta | None:
    """The sidecar already beside ``out`` (None: a fresh file); refuse a file another config owns."""
    sidecar = meta_path(out)
    if not sidecar.exists():
        if out.exists() and out.stat().st_size > 0:
            raise ConfigError(f"{out} exists without its sidecar {sidecar}, so nothing says what produced it; "
                              "use another regenerate.out or delete it")
        return None
    existing = read_meta(out)
    ours, theirs = meta.settings(), existing.settings()
    if ours != theirs:
        differ = "; ".join(f"{key}: {theirs.get(key)!r} there, {ours.get(key)!r} here"
                           for key in ours if ours.get(key) != theirs.get(key))
        raise ConfigError(f"{out} belongs to another config ({differ}); use another regenerate.out or delete it "
                          f"and {sidecar}")
    return existing


@contextmanager
def connected(job: RegenerateJob, served: str, target: str) -> Iterator[list[Server]]:
    """A client per server, each checked to serve ``served``; closed on exit."""
    settings = job.regenerate
    servers = [Server(url, engine=settings.engine, model=target, retries=settings.retries,
                      timeout_s=settings.timeout_s, connections=settings.concurrency) for url in settings.servers]
    try:
        for server in servers:
            server.check_serves(served)
        yield servers
    finally:
        for server in servers:
            server.close()


def _body(job: RegenerateJob, served: str, request: Request, max_tokens: int, seed: int) -> JSONDict:
    prompt = request.text if request.text is not None else request.prompt.token_ids
    return completion_body(job.regenerate.engine, served, prompt, job.sampling, max_tokens, seed)


def probe_sampling(server: Server, job: RegenerateJob, served: str, request: Request) -> None:
    """At a temperature above 0: several seeds give different responses, and one seed twice the same."""
    if Sampling(**asdict(job.sampling)).greedy:
        return
    max_tokens = min(job.collect.max_new_tokens, PROBE_TOKENS)
    seeds = [prompt_seed(job.seed, f"probe/{i}") for i in range(PROBE_SEEDS)]
    where = f"sampling probe ({request.where})"

    def ask(seed: int) -> str:
        return server.complete(_body(job, served, request, max_tokens, seed), where).text

    texts = [ask(seed) for seed in seeds]
    engine = job.regenerate.engine
    if len(set(texts)) == 1:
        fix = NOT_SAMPLING_FIX.get(engine, "check what overrides the request's sampling settings there")
        raise ServerError(f"{server.url} is not sampling: {PROBE_SEEDS} seeds gave one response to {request.where} "
                          f"at temperature {job.sampling.temperature}; {fix}")
    if ask(seeds[0]) != texts[0]:
        fix = SEED_FIX.get(engine, "check that it honours the request's seed")
        raise ServerError(f"{server.url} ignores per-request seeds: one seed gave two responses to {request.where}, "
                          f"so the responses would not be reproducible; {fix}")


def _fetch(server: Server, job: RegenerateJob, served: str, request: Request) -> tuple[Request, Completion]:
    body = _body(job, served, request, job.collect.max_new_tokens, request.seed)
    return request, server.complete(body, request.where)


def send(requests: list[Request], servers: list[Server], job: RegenerateJob, served: str, writer: ResponsesWriter,
         summary: RegenerateSummary) -> None:
    """Deal ``requests`` round-robin across ``servers`` and write each reply as it arrives.

    On the first failure no further request starts; replies still in flight are written, then it is raised.
    """
    summary.servers = stats = [ServerStats(server.url) for server in servers]
    pools = [ThreadPoolExecutor(job.regenerate.concurrency, thread_name_prefix=f"server{i}")
             for i in range(len(servers))]
    futures: dict[Future, int] = {}  # → the index of its server
    started = time.perf_counter()
    for i, request in enumerate(requests):
        index = i % len(servers)
        futures[pools[index].submit(_fetch, servers[index], job, served, request)] = index
        stats[index].sent += 1
    failure: BaseException | None = None
    bar = tqdm(total=len(requests), desc="regenerate", unit="response")
    try:
        for future in as_completed(futures):
            if future.cancelled():
                continue
            if future.exception() is not None:
                failure = failure or future.exception()
                for pending in futures:
                    pending.cancel()
                continue
            request, completion = future.result()
            writer.write(ResponseRow.of(request, completion).to_dict())
            _count(stats[futures[future]], summary, request, completion)
            bar.update(1)
            bar.set_postfix(tok_s=f"{summary.tokens / max(time.perf_counter() - started, 1e-9):.0f}")
    finally:
        bar.close()
        for pool in pools:
            pool.shutdown(cancel_futures=True)
        summary.seconds = time.perf_counter() - started
        for server, server_stats in zip(servers, stats):
            server_stats.retries = server.retried
    if failure is not None:
        raise failure


def _count(stats: ServerStats, summary: RegenerateSummary, request: Request, completion: Completion) -> None:
    stats.written += 1
    stats.tokens += completion.completion_tokens or 0
    if completion.prompt_tokens is not None:
        summary.prompt_tokens_checked += 1
        summary.prompt_tokens_differ += completion.prompt_tokens != len(request.prompt.token_ids)


def regenerate(job: RegenerateJob) -> RegenerateSummary:
    """Fill ``regenerate.out`` with a response to every prompt of every split; returns what was done."""
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request would bury the progress bar
    target = resolve_model_id(job.models.target, job.paths.zoo_dir)
    tokenizer = load_tokenizer(target, revision=job.models.target.revision)
    requests, skipped = plan(job, tokenizer, target_context(target, job.models.target.revision))
    served = job.regenerate.served_model or target
    meta = ResponsesMeta(model=job.models.target.id, revision=job.models.target.revision, sampling=asdict(job.sampling),
                         max_tokens=job.collect.max_new_tokens, seed=job.seed, engine=job.regenerate.engine,
                         servers=list(job.regenerate.servers), served_model=served,
                         tokenizer_hash=tokenizer_hash(tokenizer), complete=False)
    out = Path(job.regenerate.out)
    on_disk = check_output(out, meta)
    writer = ResponsesWriter(out)
    try:
        done = writer.done()
        todo = [r for r in requests if r.key not in done]
        prompts = {split: sum(r.split == split for r in requests) for split in job.collect.splits}
        summary = RegenerateSummary(out, prompts, skipped, resumed=len(requests) - len(todo))
        if todo:
            with connected(job, served, target) as servers:
                for server in servers:
                    probe_sampling(server, job, served, todo[0])
                if on_disk is None or on_disk.complete:
                    write_meta(out, meta)  # complete=False until the last response is in
                    on_disk = meta
                if job.regenerate.engine == "transformers" and job.regenerate.concurrency > 1:
                    print(SHARED_SEED_NOTE, file=sys.stderr)
                send(todo, servers, job, served, writer, summary)
        summary.complete = all(r.key in writer.done() for r in requests)
        if summary.complete and (on_disk is None or not on_disk.complete):
            write_meta(out, replace(meta, complete=True))
    finally:
        writer.close()
    print_summary(summary)
    return summary


def print_summary(summary: RegenerateSummary) -> None:
    """The end-of-run table, one column per server (and their total): sent, written, speed, retries."""
    columns = [*summary.servers]
    if len(columns) > 1:
        columns.append(ServerStats("total", sum(s.sent for s in columns), summary.written, summary.tokens,
                                   sum(s.retries for s in columns)))
    if columns:
        table = Table(title="data_gen.regenerate")
        table.add_column("")
        for stats in columns:
            table.add_column(stats.url, justify="right")
        seconds = max(summary.seconds, 1e-9)
        for name, cell in (("prompts sent", lambda s: str(s.sent)), ("responses written", lambda s: str(s.written)),
                           ("response tokens", lambda s: str(s.tokens)), ("seconds", lambda s: f"{seconds:.1f}"),
                           ("responses/s", lambda s: f"{s.written / seconds:.2f}"),
                           ("tokens/s", lambda s: f"{s.tokens / seconds:.0f}"), ("retries", lambda s: str(s.retries))):
            table.add_row(name, *[cell(stats) for stats in columns])
        Console().print(table)
    counts = ", ".join(f"{split} {n}" for split, n in summary.prompts.items())
    skipped = "; ".join(f"{split}: {', '.join(f'{k} {v}' for k, v in reasons.items())}"
                        for split, reasons in summary.skipped.items() if reasons)
    print(f"prompts: {counts} ({summary.resumed} already in the file){f'; skipped {skipped}' if skipped else ''}")
    if summary.prompt_tokens_checked:
        print(f"server prompt length differs from len(prompt_ids): {summary.prompt_tokens_differ} of "
              f"{summary.prompt_tokens_checked} rows")
    print(f"{summary.out}: {'complete' if summary.complete else 'incomplete'}")


@hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run_entry(cfg, "data_gen.regenerate", lambda config: regenerate(config.regenerate_job()), check)


if __name__ == "__main__":
    main()
