"""Labelling responses produced outside the job (data_gen.responses): equivalence with in-job collection,
the file formats, the sidecar checks, the sampling check, torchrun and device_map targets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from ahconf.schema import ConfigError
from data_gen.collect import collect
from data_gen.responses import ResponsesMeta, ResponsesWriter, given_responses, read_meta, read_rows, write_meta
from data_gen.shards import MANIFEST_FILE, CollectionDirError, load_split
from decode.artifacts.hub import load_tokenizer
from tests.helpers.config import compose_config, model_overrides

SAMPLED = ("sampling.temperature=0.8", "sampling.top_k=100")
# Columns that come from the target's logits: a cached incremental forward (in-job) vs one full forward (given).
TARGET_COLUMNS = ("target_prob", "label_speculative", "label_ensemble_weighted", "label_ensemble_contrastive", "js",
                  "kl", "tv", "response_logprob", "target_entropy")


def _config(micro_trio, root: Path, *extra: str):
    return compose_config(*model_overrides(micro_trio), f"paths.root={root}", "prompts.sizes={train: 10, dev: 4}",
                          "prompts.max_prompt_tokens=120", "prompts.truncation=left", "collect.max_new_tokens=12",
                          "collect.batch_size=4", "collect.shard_size=4", *extra)


@pytest.fixture(scope="module")
def generated(micro_trio, tmp_path_factory):
    """An ordinary collection (the target samples in the job) at T = 0.8, top-k 100."""
    root = tmp_path_factory.mktemp("generated")
    config = _config(micro_trio, root, *SAMPLED)
    collect(config.collect_job())
    return config, Path(config.paths.data_dir)


def _by_prompt(data_dir: Path, split: str) -> dict[str, dict]:
    return {row["prompt_id"]: row for row in load_split(data_dir, split)}


def _assert_same_columns(expected_dir: Path, actual_dir: Path) -> None:
    for split in ("train", "dev"):
        expected, actual = _by_prompt(expected_dir, split), _by_prompt(actual_dir, split)
        assert set(actual) == set(expected) and len(actual) >= 4
        for prompt_id, row in expected.items():
            other = actual[prompt_id]
            assert list(other) == list(row)
            for column, values in row.items():
                if column in TARGET_COLUMNS:
                    torch.testing.assert_close(torch.tensor(other[column]), torch.tensor(values), atol=2e-5, rtol=2e-5,
                                               msg=f"{split}/{prompt_id}/{column}")
                else:
                    assert other[column] == values, f"{split}/{prompt_id}/{column}"


def test_labels_of_a_collections_own_responses_equal_the_collected_ones(generated, micro_trio, tmp_path):
    """Re-labelled from the collection directory (target teacher-forced, one forward per batch), every column equals
    the in-job one: exactly where it does not depend on the target's logits, within float tolerance where it does."""
    _, data_dir = generated
    manifest = collect(_config(micro_trio, tmp_path, *SAMPLED, f"responses={data_dir}").collect_job())
    _assert_same_columns(data_dir, tmp_path / "tiny" / "data")
    assert manifest.responses["meta"]["engine"] == "data_gen.collect"
    assert manifest.responses["path"] == str(data_dir.resolve())
    assert all(stats["sampling_check"]["passed"] for stats in manifest.splits.values())


def _export_jsonl(data_dir: Path, path: Path, tokenizer, *, with_ids: bool, splits=("train", "dev")) -> None:
    """The collection's responses as a serving engine's log: rendered prompt text, response text, finish reason."""
    rows = []
    for split in splits:
        for row in load_split(data_dir, split):
            response = row["response_ids"][:-1] if row["finished"] else row["response_ids"]
            rows.append({"split": split, "prompt_id": row["prompt_id"], "prompt_ids": row["prompt_ids"],
                         "response": tokenizer.decode(response),
                         "finish_reason": "stop" if row["finished"] else "length",
                         **({"response_ids": row["response_ids"]} if with_ids else {})})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _sidecar(path: Path, target: str, **overrides) -> None:
    meta = {"model": target, "sampling": {"temperature": 0.8, "top_k": 100, "top_p": None}, "max_tokens": 12}
    write_meta(path, ResponsesMeta(**(meta | overrides)))


def test_jsonl_and_parquet_sources_with_token_ids_label_like_the_collection(generated, micro_trio, tmp_path):
    _, data_dir = generated
    source = tmp_path / "responses.jsonl"
    _export_jsonl(data_dir, source, load_tokenizer(str(micro_trio["target"])), with_ids=True)
    _sidecar(source, str(micro_trio["target"]))
    manifest = collect(_config(micro_trio, tmp_path / "jsonl", *SAMPLED, f"responses={source}").collect_job())
    _assert_same_columns(data_dir, tmp_path / "jsonl" / "tiny" / "data")
    # A random-weight model's text rarely re-tokenizes to the sampled ids: the ids were used and the rows counted.
    assert sum(n.get("retokenization_differs", 0) for n in manifest.responses["notes"].values()) > 0
    parquet = tmp_path / "responses.parquet"
    pq.write_table(pa.Table.from_pylist(read_rows(source)), parquet)
    _sidecar(parquet, str(micro_trio["target"]))
    collect(_config(micro_trio, tmp_path / "parquet", *SAMPLED, f"responses={parquet}").collect_job())
    _assert_same_columns(data_dir, tmp_path / "parquet" / "tiny" / "data")


def test_text_responses_are_tokenized_as_the_decoder_sees_them(micro_trio):
    tokenizer = load_tokenizer(str(micro_trio["target"]))
    text = "def add(a, b):\n    return a + b\n"
    rows = [{"prompt": "def f(x):", "response": "return x", "finish_reason": "stop", "split": "dev", "prompt_id": "a"},
            {"prompt": "import os", "response": text, "finish_reason": "length", "split": "dev", "prompt_id": "b"},
            {"prompt": "import os", "response": "x", "split": "dev", "prompt_id": "b"},
            {"prompt": "class A:", "response": text * 20, "split": "dev", "prompt_id": "c"}]
    got = given_responses(rows, "dev", tokenizer, add_special_tokens=True, sizes={}, max_new_tokens=12, context=192,
                          source="t")
    body = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert got.rows[0].prompt_ids == tokenizer("def f(x):")["input_ids"]
    short = tokenizer("return x", add_special_tokens=False)["input_ids"]
    assert got.rows[0].response_ids == short + [tokenizer.eos_token_id]
    assert len(body) > 12 and got.rows[1].response_ids == body[:12]
    assert [r.prompt_id for r in got.rows] == ["a", "b", "c"]
    assert got.skipped == {"duplicate_prompt_id": 1}
    assert got.notes["cut_to_max_new_tokens"] == 2


def test_rows_without_a_split_are_carved_by_content(micro_trio):
    tokenizer = load_tokenizer(str(micro_trio["target"]))
    rows = [{"prompt": f"def f{i}(x):", "response": "return x"} for i in range(30)]
    sizes = {"train": 20, "dev": 5, "test": 5}
    splits = {s: given_responses(rows, s, tokenizer, add_special_tokens=True, sizes=sizes, max_new_tokens=12,
                                 context=192, source="t").rows for s in sizes}
    assert {s: len(r) for s, r in splits.items()} == sizes
    ids = [r.prompt_id for rows_ in splits.values() for r in rows_]
    assert len(set(ids)) == 30
    shuffled = given_responses(rows[::-1], "dev", tokenizer, add_special_tokens=True, sizes=sizes, max_new_tokens=12,
                               context=192, source="t").rows
    assert [r.prompt_id for r in shuffled] == [r.prompt_id for r in splits["dev"]]


def test_a_dataset_directory_source_is_read(tmp_path):
    rows = [{"prompt": "a", "response": "b", "split": "train"}]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"))
    assert read_rows(tmp_path / "ds") == rows


@pytest.mark.parametrize("problem, message", [
    ({"sampling": {"temperature": 1.0, "top_k": None, "top_p": None}},
     r"was sampled with .*temperature': 1.0.*set sampling"),
    ({"model": "other/model"}, r"holds responses of other/model .* but the run's target is"),
    ({"complete": False}, r"is incomplete .* data_gen.regenerate"),
])
def test_a_sidecar_that_does_not_match_the_run_is_refused(generated, micro_trio, tmp_path, problem, message):
    _, data_dir = generated
    source = tmp_path / "responses.jsonl"
    _export_jsonl(data_dir, source, load_tokenizer(str(micro_trio["target"])), with_ids=False)
    _sidecar(source, str(micro_trio["target"]), **problem)
    with pytest.raises(ConfigError, match=message):
        collect(_config(micro_trio, tmp_path, *SAMPLED, f"responses={source}").collect_job())
    assert not (tmp_path / "tiny" / "data").exists(), "nothing is written before the source is accepted"


def test_bad_sources_are_one_line_with_exit_status_2(generated, micro_trio, tmp_path):
    _, data_dir = generated
    source = tmp_path / "responses.jsonl"
    command = [sys.executable, "-m", "data_gen.collect", *model_overrides(micro_trio), f"paths.root={tmp_path}",
               *SAMPLED, f"responses={source}"]

    def error_line() -> str:
        result = subprocess.run(command, check=False, capture_output=True, text=True, timeout=300)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ")
        return lines[0]

    assert "do not exist" in error_line()
    _export_jsonl(data_dir, source, load_tokenizer(str(micro_trio["target"])), with_ids=False)
    assert "has no sidecar" in error_line()
    _sidecar(source, str(micro_trio["target"]))
    with source.open("a") as handle:
        handle.write('{"split": "train", "prompt": "cut sh')
    assert f"{source}:" in error_line() and "truncated line" in error_line()


def test_a_changed_source_does_not_resume_into_the_same_directory(generated, micro_trio, tmp_path):
    _, data_dir = generated
    source = tmp_path / "responses.jsonl"
    tokenizer = load_tokenizer(str(micro_trio["target"]))
    _export_jsonl(data_dir, source, tokenizer, with_ids=True)
    _sidecar(source, str(micro_trio["target"]))
    config = _config(micro_trio, tmp_path, *SAMPLED, f"responses={source}")
    collect(config.collect_job())
    lines = source.read_text().splitlines()
    source.write_text("\n".join(lines[1:]) + "\n")
    with pytest.raises(CollectionDirError, match="differs in: responses"):
        collect(config.collect_job())


def test_greedy_responses_passed_off_as_samples_fail_the_sampling_check(micro_trio, tmp_path, capsys):
    """Negative control: a server that ignored the temperature (greedy text labelled as T = 1 samples) is flagged;
    the same run's real samples (positive control) pass."""
    greedy = _config(micro_trio, tmp_path / "greedy", "sampling=greedy", "collect.splits=[train]",
                     "prompts.sizes={train: 40}", "collect.max_new_tokens=24")
    collect(greedy.collect_job())
    sampled = _config(micro_trio, tmp_path / "sampled", "collect.splits=[train]", "prompts.sizes={train: 40}",
                      "collect.max_new_tokens=24")
    real = collect(sampled.collect_job())
    assert real.splits["train"]["sampling_check"]["passed"], real.splits["train"]["sampling_check"]
    source = tmp_path / "responses.jsonl"
    _export_jsonl(Path(greedy.paths.data_dir), source, load_tokenizer(str(micro_trio["target"])), with_ids=True,
                  splits=["train"])
    write_meta(source, ResponsesMeta(model=str(micro_trio["target"]), sampling={"temperature": 1.0, "top_k": None,
                                                                                "top_p": None}, max_tokens=24))
    capsys.readouterr()
    manifest = collect(_config(micro_trio, tmp_path / "relabel", "collect.splits=[train]", "prompts.sizes={train: 40}",
                               "collect.max_new_tokens=24", f"responses={source}").collect_job())
    check = manifest.splits["train"]["sampling_check"]
    assert not check["passed"] and check["z"] < -4 and check["mean_surprisal"] < check["mean_entropy"]
    assert "do not look like samples of the run's transform" in capsys.readouterr().err


def test_two_process_torchrun_labels_the_same_rows(generated, micro_trio, tmp_path):
    """Two ranks on the CPU label the given responses as one process does on the same device. Draws are made on
    the models' device, so on a CUDA machine (where the in-process fixture ran on the GPU) the reference is a
    one-process CPU run of the same command."""
    _, data_dir = generated

    def label(root: Path, *launcher: str) -> Path:
        command = [sys.executable, *launcher, "-m", "data_gen.collect", *model_overrides(micro_trio),
                   f"paths.root={root}", "prompts.sizes={train: 10, dev: 4}", "collect.max_new_tokens=12",
                   "collect.batch_size=4", "collect.shard_size=4", "prompts.max_prompt_tokens=120",
                   "prompts.truncation=left", *SAMPLED, f"responses={data_dir}"]
        result = subprocess.run(command, check=False, capture_output=True, text=True, timeout=600,
                                env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
        assert result.returncode == 0, result.stderr[-3000:]
        return root / "tiny" / "data"

    two = label(tmp_path / "two", "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29519")
    assert json.loads((two / MANIFEST_FILE).read_text())["world_size"] == 2
    _assert_same_columns(label(tmp_path / "one") if torch.cuda.is_available() else data_dir, two)


def test_a_device_map_target_labels_like_a_plain_one(generated, micro_trio, tmp_path):
    pytest.importorskip("accelerate")
    _, data_dir = generated
    collect(_config(micro_trio, tmp_path, *SAMPLED, "models.target.device_map=auto",
                    f"responses={data_dir}").collect_job())
    _assert_same_columns(data_dir, tmp_path / "tiny" / "data")


def test_the_regeneration_writer_resumes_after_a_cut_line(tmp_path):
    path = tmp_path / "r.jsonl"
    writer = ResponsesWriter(path)
    writer.write({"split": "train", "prompt_id": "a", "response": "x"})
    writer.close()
    with path.open("a") as handle:
        handle.write('{"split": "train", "prompt_id": "b", "resp')  # a kill -9 mid-write
    writer = ResponsesWriter(path)
    assert writer.done() == {("train", "a")}
    writer.write({"split": "train", "prompt_id": "a", "response": "again"})
    writer.write({"split": "train", "prompt_id": "b", "response": "y"})
    writer.close()
    assert [(r["prompt_id"], r["response"]) for r in read_rows(path)] == [("a", "x"), ("b", "y")]


def test_sampling_config_of_the_sidecar_is_validated(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text("")
    (tmp_path / "r.jsonl.meta.json").write_text(json.dumps({"model": "m", "sampling": {"temperature": -1},
                                                            "max_tokens": 4}))
    with pytest.raises(ConfigError, match="is not a responses sidecar"):
        read_meta(path)


def test_given_responses_are_batched_by_length_and_forced_in_parts_within_the_token_budget():
    from data_gen.collect import CPU_FORCED_TOKENS, batches_of, forced_parts
    from data_gen.responses import GivenResponse

    rows = [GivenResponse(str(i), [1] * (5 + 37 * i % 120), [2] * (1 + 53 * i % 128)) for i in range(40)]
    batches = batches_of(rows, 16, by_length=True)
    flat = [i for batch in batches for i in batch]
    assert sorted(flat) == list(range(40)) and [len(b) for b in batches] == [16, 16, 8]
    lengths = [len(rows[i].prompt_ids) + len(rows[i].response_ids) for i in flat]
    assert lengths == sorted(lengths)
    assert [i for batch in batches_of(rows, 16, by_length=False) for i in batch] == list(range(40))
    ordered = [rows[i] for i in flat]
    parts = forced_parts(ordered, torch.device("cpu"))
    assert [r for part in parts for r in part] == ordered and len(parts) > 1
    for part in parts:
        width = max(len(r.prompt_ids) for r in part) + max(len(r.response_ids) for r in part)
        assert len(part) == 1 or width * len(part) <= CPU_FORCED_TOKENS
    assert forced_parts(ordered, torch.device("meta")) == [ordered]


def test_a_json_list_of_records_is_read_and_an_unknown_suffix_is_one_line(tmp_path):
    rows = [{"prompt": "a", "response": "b", "split": "train"}, {"prompt": "c", "response": "d", "split": "dev"}]
    (tmp_path / "r.json").write_text(json.dumps(rows))
    assert read_rows(tmp_path / "r.json") == rows
    (tmp_path / "r.csv").write_text("prompt,response\n")
    with pytest.raises(ConfigError, match=r"responses .*r\.csv: unsupported suffix"):
        read_rows(tmp_path / "r.csv")
