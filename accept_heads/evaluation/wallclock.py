"""Wall-clock throughput at batch 1: the dev-chosen policies, the HF baselines and the target alone taking turns.

After the dev selection, every prompt of a timed set is decoded once by each method, one after
another, the order rotating from prompt to prompt, so that drift on a shared machine (other
processes, clocks, caches) hits every method alike, and no method always runs first. A method's
tokens/s is its generated tokens over its own measured seconds (device-synchronised on CUDA). Each
method decodes a prompt with the seed of its counted-call run, so it reproduces that run's output:
``matches`` is the share of timed outputs equal to the counted run's (:func:`runs.output_sha`).
Ratios to the best fixed K and to the target alone carry 95 % paired-bootstrap intervals over
prompts (:mod:`accept_heads.measure.bootstrap`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import partial

import pandas as pd
import torch
from tqdm.auto import tqdm

from accept_heads.evaluation.baselines import HFRunner
from accept_heads.evaluation.executor import Executor
from accept_heads.measure.bootstrap import PromptCosts, paired_draws, ratio_interval
from accept_heads.measure.families import family, family_names
from accept_heads.measure.runs import DecoderRunner, RunSpec, output_sha
from accept_heads.measure.specs import TargetAloneSpec
from decode.compile.config import DEFAULT, CompileConfig
from decode.compile.owner import compile_log
from decode.loops.prompt_input import prompt_cache_length
from decode.threads import torch_threads
from decode.timing import synchronize
from runtime.encoding import EncodedPrompt
from runtime.seeding import prompt_seed

#: A prompt → its generated tokens (1-D).
Decode = Callable[[EncodedPrompt], torch.Tensor]


@dataclass(frozen=True)
class TimedMethod:
    """One method of the comparison: its run (the target alone is a ``target`` run) and how it decodes a prompt."""

    spec: RunSpec
    decode: Decode


@dataclass(frozen=True)
class Timing:
    """One prompt decoded by one method: a row of ``wallclock.parquet``; ``turn``: its place in the prompt's round."""

    set: str
    rule: str
    family: str
    policy: str
    artifact: str | None
    param: float | None
    prompt_id: str
    turn: int
    generated: int
    seconds: float
    output_sha: str


def no_sync() -> None:
    """The device sync of a CPU run: nothing to wait for."""


def take_turns(methods: Sequence[TimedMethod], prompts: Sequence[EncodedPrompt], *,
               clock: Callable[[], float] = time.perf_counter, sync: Callable[[], None] = no_sync,
               warmup: Sequence[EncodedPrompt] = (), progress: str | None = None) -> list[Timing]:
    """Decode every prompt with every method in turn (prompt ``i`` starts at method ``i mod M``), timing each
    decode with ``clock`` between two ``sync`` calls; the ``warmup`` prompts are decoded once by every method
    beforehand, untimed (first-call allocations, thread start-up, compiling: :func:`warmup_prompts`)."""
    for prompt in warmup:
        for method in methods:
            method.decode(prompt)
    timings = []
    for index, prompt in enumerate(tqdm(prompts, desc=progress, unit="prompt", dynamic_ncols=True,
                                        disable=progress is None)):
        shift = index % len(methods)
        for turn, method in enumerate([*methods[shift:], *methods[:shift]]):
            sync()
            start = clock()
            tokens = method.decode(prompt)
            sync()
            seconds = clock() - start
            spec = method.spec
            timings.append(Timing(set=spec.set, rule=spec.rule, family=spec.family, policy=spec.label,
                                  artifact=spec.artifact, param=spec.param, prompt_id=prompt.prompt_id, turn=turn,
                                  generated=len(tokens), seconds=seconds,
                                  output_sha=output_sha(tokens, 0, len(tokens))))
    return timings


def warmup_prompts(prompts: Sequence[EncodedPrompt], max_new_tokens: int) -> list[EncodedPrompt]:
    """The first prompt, and the first of each other cache length a compiled decode of them uses
    (:func:`decode.loops.prompt_input.prompt_cache_length`): each length compiles its own graphs, which must not happen
    while a method is timed."""
    chosen: dict[int, EncodedPrompt] = {}
    for prompt in prompts:
        chosen.setdefault(prompt_cache_length(len(prompt.token_ids), max_new_tokens), prompt)
    return list(chosen.values())


def timed_specs(specs: Sequence[RunSpec], set_name: str, rule: str) -> list[RunSpec]:
    """The runs of ``set_name`` × ``rule`` that the wall clock times: the target alone, then every decoded run of a
    timed family (:attr:`~accept_heads.measure.families.Family.timed`) that is not a grid point (tuned ones at
    their dev choice), in table order."""
    timed = family_names(timed=True)
    chosen = [s for s in specs if s.set == set_name and s.rule == rule and s.family in timed
              and s.chosen_on != "grid"]
    chosen.sort(key=lambda s: timed.index(s.family))
    return [RunSpec(set=set_name, rule=rule, policy=TargetAloneSpec()), *chosen]


def timed_method(spec: RunSpec, decoding: DecoderRunner, hf: HFRunner) -> TimedMethod:
    """How ``spec`` decodes one prompt: our decoder with its policy, HF assisted generation, or the target alone
    (HF ``generate``; compiled: :class:`decode.policies.TargetOnly` in our loop)."""
    def tail(sequences: torch.Tensor, prompt: EncodedPrompt) -> torch.Tensor:
        return sequences.reshape(-1)[len(prompt.token_ids):]

    alone = isinstance(spec.policy, TargetAloneSpec)
    if alone and not decoding.compile:
        return TimedMethod(spec, lambda prompt: tail(hf.target_alone(spec.rule, prompt), prompt))
    if not alone and family(spec.family).runner == "hf":
        return TimedMethod(spec, lambda prompt: tail(hf.assisted(spec, prompt), prompt))
    # compiled, the target alone is our own loop drafting nothing, on the same compiled forwards
    decoder = decoding.target_alone(spec.rule) if alone else decoding.decoder(spec)

    def ours(prompt: EncodedPrompt) -> torch.Tensor:
        seed = prompt_seed(decoding.seed, prompt.prompt_id)
        return tail(decoder.generate(prompt.token_ids, max_new_tokens=decoding.max_new_tokens, seed=seed).sequences,
                    prompt)

    return TimedMethod(spec, ours)


def device_sync(device: str) -> Callable[[], None]:
    """What waits for the device's queued work before a clock is read."""
    return partial(synchronize, torch.device(device))


def _prompt_rates(frame: pd.DataFrame, prompt_ids: tuple[str, ...]) -> PromptCosts:
    """One method's per-prompt tokens and measured seconds, in ``prompt_ids`` order."""
    rows = frame.set_index("prompt_id").loc[list(prompt_ids)]
    return PromptCosts(prompt_ids, rows["generated"].to_numpy(float), rows["seconds"].to_numpy(float))


def summarise(timings: Sequence[Timing], counted: pd.DataFrame, seed: int) -> pd.DataFrame:
    """One row per set × rule × method: tokens/s, its ratio to the best fixed K and to the target alone (95 %
    paired-bootstrap intervals over prompts), and ``matches``: the share of its outputs equal to those of its
    counted-call run in ``counted`` (the evaluation's generations; NaN for the target alone, which has none)."""
    frame = pd.DataFrame([asdict(t) for t in timings])
    rows = []
    for (set_name, rule), group in frame.groupby(["set", "rule"], sort=False):
        prompt_ids = tuple(sorted(set(group["prompt_id"])))
        draws = paired_draws(len(prompt_ids), seed)
        methods = {policy: _prompt_rates(g, prompt_ids) for policy, g in group.groupby("policy", sort=False)}
        families = dict(zip(group["policy"], group["family"]))
        references = {"fixed": next((p for p, f in families.items() if f == "fixed"), None),
                      "target": next((p for p, f in families.items() if f == "target"), None)}
        for policy, run in methods.items():
            first = group[group["policy"] == policy].iloc[0]
            row = {"set": set_name, "rule": rule, "family": first["family"], "policy": policy,
                   "artifact": first["artifact"], "param": first["param"], "prompts": len(prompt_ids),
                   "generated": int(run.generated.sum()), "seconds": float(run.seconds.sum()),
                   "tokens_per_s": float(run.generated.sum() / run.seconds.sum()),
                   "matches": _matches(group[group["policy"] == policy], counted)}
            for name, reference in references.items():
                ratio = low = high = float("nan")
                if reference is not None:
                    ref = methods[reference]
                    ratio = row["tokens_per_s"] / float(ref.generated.sum() / ref.seconds.sum())
                    low, high = ratio_interval(run, ref, draws)
                row |= {f"x_{name}": ratio, f"x_{name}_lo": low, f"x_{name}_hi": high}
            rows.append(row)
    return pd.DataFrame(rows)


def _matches(timed: pd.DataFrame, counted: pd.DataFrame) -> float:
    """Share of ``timed``'s outputs equal to its counted run's (same set, rule, policy and prompt)."""
    first = timed.iloc[0]
    if first["family"] == "target":
        return float("nan")
    runs = counted[(counted["set"] == first["set"]) & (counted["rule"] == first["rule"])
                   & (counted["policy"] == first["policy"])]
    expected = dict(zip(runs["prompt_id"], runs["output_sha"]))
    return float((timed["output_sha"] == timed["prompt_id"].map(expected)).mean())


def with_modelled(summary: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """``summary`` beside the modelled figures of the same runs (the results table's throughput and speed-up over
    the best fixed K at the ``cost`` model, ``_cost``, and at the costs fitted on this machine, ``_fitted``)."""
    columns = [f"{metric}_{model}" for model in ("cost", "fitted") for metric in ("throughput", "speedup_fixed")]
    modelled = table[["set", "rule", "policy", *columns]].drop_duplicates(["set", "rule", "policy"])
    return summary.merge(modelled, on=["set", "rule", "policy"], how="left")


def measure(executor: Executor, specs: Sequence[RunSpec], counted: pd.DataFrame) -> tuple[list[Timing], pd.DataFrame]:
    """The wall-clock stage of the evaluation (``evaluate.wallclock``) on every timed set and rule, in this
    process with ``evaluate.wallclock.threads`` torch threads; its timings and their summary (:func:`summarise`)."""
    e = executor.job.evaluate
    rules = [rule for rule in e.wallclock.rules if rule in set(counted["rule"])]
    timings: list[Timing] = []
    with torch_threads(e.wallclock.threads or len(os.sched_getaffinity(0))):
        for prompts in (s for s in executor.sets.values() if s.role in e.wallclock.sets):
            for rule in rules:
                methods = [timed_method(spec, executor.decoding, executor.hf)
                           for spec in timed_specs(specs, prompts.name, rule)]
                timed = prompts.prompts[: e.wallclock.prompts]
                timings += take_turns(methods, timed, sync=device_sync(executor.device),
                                      warmup=warmup_prompts(timed, executor.decoding.max_new_tokens),
                                      progress=f"wall clock: {prompts.name} {rule} ({len(methods)} methods in turn)")
    return timings, summarise(timings, counted, executor.job.seed) if timings else pd.DataFrame()


@dataclass(frozen=True)
class WallclockDescription:
    """Metadata of the wall-clock stage: where and how it ran."""

    device: str  # where the methods decoded
    dtype: str  # the target's (e.g. float32)
    threads: int  # torch threads of the timing process (evaluate.wallclock.threads, else every usable core)
    sets: list[str]  # evaluate.wallclock.sets: the roles timed
    prompts: int | None  # evaluate.wallclock.prompts: the first this-many of each set (None: all)
    rules: list[str]  # evaluate.wallclock.rules
    forwards: str  # compiled or eager, how the target alone decoded, and what compiling cost this process
    compile: CompileConfig | None  # the compiled forwards' settings, as each decode's stats record them (None: eager)
    batch: int = 1  # prompts per decode
    warmup_prompts: str = "the first, and the first of each other compiled cache length"
    order: str = "every prompt decoded by each method in turn, the first method rotating from prompt to prompt"
    tokens_per_s: str = "generated tokens / seconds measured around each decode (device-synchronised)"
    intervals: str = "95 % paired bootstrap over prompts"


def describe(executor: Executor) -> WallclockDescription:
    """The wall-clock stage's metadata (:class:`WallclockDescription`)."""
    e, compiled = executor.job.evaluate, executor.job.decoding.compile
    forwards = ("compiled, static caches; the target alone in our loop (TargetOnly)" + compiled_here(executor)
                if compiled else "eager; the target alone by HF generate")
    return WallclockDescription(executor.device, str(executor.trio.target.dtype).removeprefix("torch."),
                                e.wallclock.threads or len(os.sched_getaffinity(0)), list(e.wallclock.sets),
                                e.wallclock.prompts, list(e.wallclock.rules), forwards, DEFAULT if compiled else None)


def compiled_here(executor: Executor) -> str:
    """What compiling cost the wall clock's process, per model of the trio that compiled (empty: none did)."""
    trio = executor.trio
    models = {"target": trio.target, "draft": trio.draft, "companion": trio.companion}
    logs = {name: log for name, model in models.items() if model is not None and (log := compile_log(model))}
    parts = [f"{name} {log.graphs} graphs in {log.seconds:.0f} s"
             + (f" ({log.eager_feeds} short feeds eager: a second cache)" if log.eager_feeds else "")
             for name, log in logs.items()]
    return f"; compiled in this process: {', '.join(parts)}" if parts else ""
