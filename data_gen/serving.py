"""Talking to OpenAI-compatible servers (``/v1/models``, ``/v1/completions``): request bodies, retries, replies.

Each engine takes the run's sampling transform in its own words (its documented request fields):

``vllm`` / ``sglang``  token-id prompts; ``temperature``, ``top_p`` (1 = off), ``top_k`` (-1 = off), ``seed``;
                       ``min_p`` and the penalties are sent neutral, since vLLM otherwise falls back to the
                       model's ``generation_config.json``; ``return_token_ids`` asks for the response's ids
                       (``choices[0].token_ids``; servers that predate it ignore the field)
``tgi``                text prompts; ``temperature`` (0 = greedy), ``top_p`` (only below 1: TGI refuses 1),
                       ``seed``; no ``top_k`` (:func:`check_engine` refuses a run that uses one)
``transformers``       ``transformers serve``: text prompts; it samples only when the request carries a
                       ``generation_config`` (a JSON string) with ``do_sample``, and fills what that leaves
                       unset from HF defaults (``top_k=50``), so the whole transform travels there; its
                       ``seed`` sets the global torch seed, which requests in flight together share

Connection errors, timeouts, 429 and 5xx are retried with exponential backoff; every other failure,
and every reply that is not a whole completion, is a :class:`ServerError` of one line.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from ahconf.schema import ConfigError, SamplingConfig
from decode.json_types import JSON, JSONDict

BACKOFF_S = 1.0  # first retry after this long, doubling up to BACKOFF_MAX_S
BACKOFF_MAX_S = 30.0
FINISH_REASONS = ("stop", "length")
TEXT_ENGINES = ("tgi", "transformers")  # engines sent the prompt as text (the others: token ids)
START_HINTS = {
    "vllm": "vllm serve {model}",
    "sglang": "python -m sglang.launch_server --model-path {model}",
    "tgi": "text-generation-launcher --model-id {model}",
    "transformers": "transformers serve --host 0.0.0.0 --port 8000 {model}",
}


class ServerError(ConfigError):
    """A server is unreachable, serves another model, or answered something that is not a whole completion."""


@dataclass(frozen=True)
class Completion:
    """One validated ``/v1/completions`` reply."""

    text: str
    finish_reason: str  # "stop" | "length"
    token_ids: list[int] | None  # the response's ids, where the server returned them
    prompt_tokens: int | None  # usage.prompt_tokens, where given
    completion_tokens: int | None  # usage.completion_tokens, else len(token_ids), else unknown


def check_engine(engine: str, sampling: SamplingConfig) -> None:
    """Refuse a transform the engine's API cannot express (offline: runs on dry runs too)."""
    if engine == "tgi" and sampling.top_k is not None:
        raise ConfigError(f"regenerate.engine=tgi: TGI's /v1/completions takes no top_k, so it cannot sample "
                          f"sampling.top_k={sampling.top_k}; serve the target with vllm or sglang, or set "
                          "sampling.top_k=null")


def _vllm_fields(sampling: SamplingConfig, max_tokens: int) -> JSONDict:
    return {"temperature": sampling.temperature, "top_p": sampling.top_p or 1.0, "top_k": sampling.top_k or -1,
            "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
            "return_token_ids": True}


def _tgi_fields(sampling: SamplingConfig, max_tokens: int) -> JSONDict:
    fields: JSONDict = {"temperature": sampling.temperature, "repetition_penalty": 1.0}
    if sampling.top_p is not None and sampling.top_p < 1:
        fields["top_p"] = sampling.top_p
    return fields


def _transformers_fields(sampling: SamplingConfig, max_tokens: int) -> JSONDict:
    config: JSONDict = {"do_sample": False, "max_new_tokens": max_tokens, "repetition_penalty": 1.0}
    if sampling.temperature > 0:
        config |= {"do_sample": True, "temperature": sampling.temperature, "top_k": sampling.top_k or 0,
                   "top_p": sampling.top_p or 1.0}
    return {"generation_config": json.dumps(config)}


ENGINE_FIELDS: dict[str, Callable[[SamplingConfig, int], JSONDict]] = {
    "vllm": _vllm_fields,
    "sglang": _vllm_fields,
    "tgi": _tgi_fields,
    "transformers": _transformers_fields,
}


def completion_body(engine: str, model: str, prompt: list[int] | str, sampling: SamplingConfig, max_tokens: int,
                    seed: int) -> JSONDict:
    """The ``/v1/completions`` request that samples one response of ``prompt`` under ``sampling``."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "seed": seed}
    return body | ENGINE_FIELDS[engine](sampling, max_tokens)


def one_line(text: str, limit: int = 200) -> str:
    """A server's message squeezed onto one line."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _optional_int(value: JSON) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def parse_completion(doc: JSON, max_tokens: int, where: str) -> Completion:
    """Validate a reply: one choice with text, a finish reason of stop / length, and a response not cut short."""
    choices = doc.get("choices") if isinstance(doc, dict) else None
    choice = choices[0] if isinstance(choices, list) and choices else None
    if not isinstance(choice, dict) or not isinstance(choice.get("text"), str):
        raise ServerError(f"{where}: malformed reply (no choices[0].text): {one_line(json.dumps(doc))}")
    reason = choice.get("finish_reason")
    if reason not in FINISH_REASONS:
        raise ServerError(f"{where}: finish_reason {reason!r} is neither 'stop' nor 'length' (an abort, a stop "
                          "string or a filter ended it); the response is not a sample of the target")
    ids = choice.get("token_ids")
    if ids is not None and not (isinstance(ids, list) and all(_optional_int(t) is not None for t in ids)):
        raise ServerError(f"{where}: malformed reply (token_ids is not a list of ints)")
    usage = doc.get("usage") if isinstance(doc.get("usage"), dict) else {}
    completion_tokens = _optional_int(usage.get("completion_tokens"))
    if completion_tokens is None and ids is not None:
        completion_tokens = len(ids)
    lengths = [n for n in (completion_tokens, None if ids is None else len(ids)) if n is not None]
    if any(n > max_tokens for n in lengths):
        raise ServerError(f"{where}: {max(lengths)} response tokens, over max_tokens={max_tokens}")
    if reason == "length" and any(n < max_tokens for n in lengths):
        raise ServerError(f"{where}: truncated reply (finish_reason 'length' after {min(lengths)} of "
                          f"{max_tokens} tokens)")
    return Completion(choice["text"], reason, ids, _optional_int(usage.get("prompt_tokens")), completion_tokens)


class Server:
    """One OpenAI-compatible server: a pooled HTTP client with retries (thread-safe)."""

    def __init__(self, url: str, *, engine: str, model: str, retries: int, timeout_s: float,
                 connections: int) -> None:
        self.url = url.rstrip("/")
        self.engine = engine
        self.model = model
        self.retries = retries
        self.retried = 0  # retries made so far (all requests)
        self._lock = threading.Lock()
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        self._client = httpx.Client(base_url=self.url, timeout=timeout_s, limits=limits)

    def close(self) -> None:
        self._client.close()

    def _hint(self) -> str:
        return START_HINTS[self.engine].format(model=self.model)

    def _request(self, method: str, path: str, body: JSONDict | None, where: str) -> JSON:
        """The reply's JSON; transport errors, 429 and 5xx are retried with exponential backoff."""
        for attempt in range(self.retries + 1):
            if attempt:
                with self._lock:
                    self.retried += 1
                time.sleep(min(BACKOFF_S * 2 ** (attempt - 1), BACKOFF_MAX_S))
            try:
                response = self._client.request(method, path, json=body)
            except httpx.TransportError as error:
                failure = f"{type(error).__name__}: {one_line(str(error)) or 'no detail'}"
                unreachable = True
                continue
            unreachable = False
            if response.status_code == 429 or response.status_code >= 500:
                failure = f"HTTP {response.status_code}: {one_line(response.text)}"
                continue
            if response.status_code >= 400:
                raise ServerError(f"{where}: {self.url} refused the request: HTTP {response.status_code}: "
                                  f"{one_line(response.text)}")
            try:
                return response.json()
            except ValueError:
                raise ServerError(f"{where}: {self.url} answered with something that is not JSON: "
                                  f"{one_line(response.text)}") from None
        tries = f"{self.retries + 1} tr{'y' if self.retries == 0 else 'ies'}"
        if unreachable:
            raise ServerError(f"cannot reach {self.url} ({failure}, {tries}); start the server first, e.g. "
                              f"`{self._hint()}`, or fix regenerate.servers")
        raise ServerError(f"{where}: {self.url} kept failing ({failure}, {tries})")

    def served_models(self) -> list[str]:
        """The model names ``GET /v1/models`` lists."""
        doc = self._request("GET", "/v1/models", None, "GET /v1/models")
        data = doc.get("data") if isinstance(doc, dict) else None
        if not isinstance(data, list) or not all(isinstance(m, dict) and isinstance(m.get("id"), str) for m in data):
            raise ServerError(f"{self.url}/v1/models is not a model list: {one_line(json.dumps(doc))}")
        return [m["id"] for m in data]

    def check_serves(self, name: str) -> None:
        """Refuse a server that does not list ``name`` (it serves another model, or under another name)."""
        served = self.served_models()
        if name not in served:
            raise ServerError(f"{self.url} serves {', '.join(served) or 'no model'}, not {name}; serve the target "
                              f"there (`{self._hint()}`) or set regenerate.served_model to the name it serves "
                              "the target under")

    def complete(self, body: JSONDict, where: str) -> Completion:
        """``POST /v1/completions`` with ``body``; the validated reply."""
        where = f"{where} on {self.url}"
        return parse_completion(self._request("POST", "/v1/completions", body, where), body["max_tokens"], where)
