"""The built-in prompt sets and the zoo's held-out text ship as data files: sha256-checked, never the running stdlib."""

from __future__ import annotations

import hashlib
import platform
import shutil
import sysconfig
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from data_gen import corpus
from data_gen.corpus import SPLITS, split_of
from data_gen.prompts import PromptSourceError, load_prompts
from data_gen.prompts.__main__ import main, stdlib_files
from data_gen.prompts.builtin import STYLES, builtin_prompts
from data_gen.prompts.shipped import (
    DATA_DIR,
    HELD_OUT_FILE,
    MANIFEST,
    held_out_modules,
    manifest,
    prompt_set_file,
    read_records,
)
from data_gen.prompts.stdlib_prompts import cut_prompts
from model_build.zoo import SHIPPED_DIR, ZooRecipe
from model_build.zoo.evaluation import realism_prompt_sets

FAKE_MODULE = '''"""A module."""

import os


def area(width, height):
    """The area of a rectangle."""
    return width * height


class Box:
    """A box."""

    def volume(self, depth):
        """Its volume."""
        return depth
'''


@pytest.fixture
def stdlib_at(monkeypatch: pytest.MonkeyPatch):
    """Point the running Python's stdlib locator at another directory (the corpus caches cleared before and after)."""
    cached = (corpus.stdlib_modules, builtin_prompts, held_out_modules)
    real_paths = sysconfig.get_paths

    def point(root: Path) -> None:
        monkeypatch.setattr(sysconfig, "get_paths", lambda *a, **k: {**real_paths(*a, **k), "stdlib": str(root)})
        for function in cached:
            function.cache_clear()

    yield point
    monkeypatch.undo()
    for function in cached:
        function.cache_clear()


def test_every_shipped_file_matches_its_sha256_in_the_manifest() -> None:
    recorded = manifest()
    assert recorded["python"] == "3.11.7"  # the Python whose stdlib the README's tables were measured on
    expected = {prompt_set_file(split, style) for split in SPLITS for style in STYLES} | {HELD_OUT_FILE}
    assert set(recorded["files"]) == expected == {path.name for path in DATA_DIR.iterdir()} - {MANIFEST}
    for name, entry in recorded["files"].items():
        assert hashlib.sha256((DATA_DIR / name).read_bytes()).hexdigest() == entry["sha256"], name
        assert len(read_records(name)) == entry["records"], name


def test_nothing_reads_the_running_standard_library(stdlib_at, tmp_path: Path) -> None:
    """Both pairs' prompts (the real pair renders the same function stubs) and the zoo's held-out text and realism
    prompt sets load identically with the stdlib out of reach."""
    tokenizer = AutoTokenizer.from_pretrained(SHIPPED_DIR / "target")
    before = {(split, style): load_prompts("builtin", split, style=style) for split in SPLITS for style in STYLES}
    held_out, realism_sets = held_out_modules(), realism_prompt_sets(tokenizer, ZooRecipe())
    stdlib_at(tmp_path)
    assert corpus.stdlib_modules() == ()  # control: the running stdlib is out of reach
    assert {(split, style): load_prompts("builtin", split, style=style) for split in SPLITS for style in STYLES} == before
    assert held_out_modules() == held_out and len(held_out) == manifest()["files"][HELD_OUT_FILE]["records"]
    assert realism_prompt_sets(tokenizer, ZooRecipe()) == realism_sets


def test_a_modified_or_missing_file_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    data = tmp_path / "data"
    shutil.copytree(DATA_DIR, data)
    name = prompt_set_file("dev", "function")
    blob = bytearray((data / name).read_bytes())
    blob[len(blob) // 2] ^= 1
    (data / name).write_bytes(bytes(blob))
    with pytest.raises(PromptSourceError) as error:
        read_records(name, data)
    assert str(error.value) == (f"{data / name} does not match its sha256 in manifest.json (corrupt or modified); "
                                "restore it from the repository (git checkout -- data_gen/prompts/data) or reinstall "
                                "accept-heads")
    assert len(read_records(prompt_set_file("dev", "module"), data)) > 0  # control: an untouched file reads
    assert main(["--data-dir", str(data)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {data / name} does not match its sha256")
    (data / name).unlink()
    with pytest.raises(PromptSourceError, match=f"cannot read the shipped file {data / name}"):
        read_records(name, data)


def test_the_rebuild_cuts_the_running_standard_library_into_the_files(stdlib_at, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture) -> None:
    stdlib = tmp_path / "lib"
    (stdlib / "tests").mkdir(parents=True)
    (stdlib / "tests" / "helper.py").write_text(FAKE_MODULE)  # test packages are not corpus
    names: dict[str, str] = {}
    for number in range(100):
        names.setdefault(split_of(f"mod{number}"), f"mod{number}")
    for name in names.values():
        (stdlib / f"{name}.py").write_text(FAKE_MODULE)
    stdlib_at(stdlib)
    data = tmp_path / "data"
    assert main(["--rebuild", "--data-dir", str(data)]) == 0
    for split, name in names.items():
        for style, prompts in cut_prompts(split).items():
            assert read_records(prompt_set_file(split, style), data) == [
                {"id": p.id, "text": p.text, "reference": p.reference} for p in prompts]
        functions = read_records(prompt_set_file(split, "function"), data)
        assert [r["id"] for r in functions] == [f"builtin/function/{name}:area", f"builtin/function/{name}:Box.volume"]
        assert functions[0]["text"] == 'def area(width, height):\n    """The area of a rectangle."""\n'
    assert read_records(HELD_OUT_FILE, data) == [{"module": names["dev"], "text": FAKE_MODULE}]
    assert manifest(data)["python"] == platform.python_version()
    assert "(changed)" in capsys.readouterr().out
    assert main(["--rebuild", "--data-dir", str(data)]) == 0
    assert "(changed)" not in capsys.readouterr().out  # the same stdlib writes the same bytes


@pytest.mark.slow
def test_the_cutter_still_cuts_the_shipped_files_on_their_python() -> None:
    """The cutting code and the shipped files agree: a change to one without a rebuild fails here."""
    if platform.python_version() != manifest()["python"]:
        pytest.skip(f"the shipped files were cut on Python {manifest()['python']}, this is {platform.python_version()}")
    for name, records in stdlib_files().items():
        assert records == read_records(name), name
