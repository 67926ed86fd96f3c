"""The steps every kind of installed models takes (``model_build.model_store``), on a kind declared here."""

from __future__ import annotations

from pathlib import Path

import pytest

from decode.artifacts.hub import ModelLoadError
from model_build.model_store import InstalledModels, ModelStore, RealismMiss, file_hashes
from runtime.install import cache_dir, write_json


class BoxError(ModelLoadError):
    pass


class BoxMiss(BoxError, RealismMiss):
    pass


BOX = ModelStore(name="box", models="set", record_file="box.json", env_var="BOX_DIR", error=BoxError,
                 realism_error=BoxMiss)
FIX = "restore it with `box --reinstall`"


def fill(staging: Path, weights: bytes = b"weights") -> dict:
    for role in ("target", "draft"):
        (staging / role).mkdir()
        (staging / role / "model.safetensors").write_bytes(weights + role.encode())
    record = {"origin": "rebuild", "files": file_hashes(staging, skip="box.json")}
    write_json(staging / "box.json", record)
    return record


def verify(directory: Path, shown: Path) -> dict:
    record = BOX.read(directory, shown, FIX)
    BOX.check_files(directory, record, None, shown, FIX)
    return record


def ensure(root: Path, reinstall: bool = False) -> InstalledModels:
    return BOX.ensure(root, "installing the box", reinstall=reinstall, verify=verify, install=fill,
                      make=InstalledModels)


def test_installed_once_then_verified_at_every_load(tmp_path):
    root = tmp_path / "box"
    first = ensure(root)
    assert first.action == "installed" and first.path("draft") == root / "draft"
    assert set(first.record["files"]) == {"target/model.safetensors", "draft/model.safetensors"}
    assert ensure(root).action == "verified" and ensure(root, reinstall=True).action == "installed"
    with pytest.raises(ValueError, match="unknown role 'drafter'"):
        first.path("drafter")
    (root / "draft" / "model.safetensors").write_bytes(b"corrupt")
    with pytest.raises(BoxError) as error:
        ensure(root)
    assert str(error.value) == (f"box file {root / 'draft/model.safetensors'} does not match its recorded sha256 "
                                f"(corrupt or modified); {FIX}")
    (root / "draft" / "model.safetensors").unlink()
    with pytest.raises(BoxError, match=r"^box file .*draft/model.safetensors is missing; restore it"):
        ensure(root)
    (root / "box.json").write_text("[]")
    with pytest.raises(BoxError, match=r"box.json is unreadable or incomplete \(TypeError\); restore it"):
        ensure(root)


def test_a_record_that_claims_to_be_the_shipped_one_must_be_it(tmp_path):
    root = tmp_path / "box"
    record = {**ensure(root).record, "origin": "shipped"}
    with pytest.raises(BoxError, match="box.json differs from the shipped set's record"):
        BOX.check_files(root, record, {**record, "files": {}}, root, FIX)
    BOX.check_files(root, record, record, root, FIX)


def test_a_rebuild_that_misses_a_target_installs_nothing_unless_forced(tmp_path):
    root = tmp_path / "box"
    ensure(root)

    def build(staging: Path) -> tuple[dict, list[str]]:
        return fill(staging, b"rebuilt"), ["acceptance = 0.5, target >= 0.6"]

    with pytest.raises(BoxMiss) as miss:
        BOX.rebuild(root, "rebuilding the box", build, require_realism=True, make=InstalledModels)
    assert str(miss.value) == (f"the rebuilt set misses 1 realism target(s) (acceptance = 0.5, target >= 0.6); kept "
                               f"{root} as it was (pass --force to install the rebuild anyway)")
    assert miss.value.record["origin"] == "rebuild" and ensure(root).action == "verified"
    assert (root / "draft" / "model.safetensors").read_bytes() == b"weightsdraft"
    shipped = []
    forced = BOX.rebuild(root, "rebuilding the box", build, require_realism=False, make=InstalledModels,
                         ship=lambda staging, record: shipped.append(sorted(p.name for p in staging.iterdir())))
    assert forced.action == "rebuilt" and shipped == [["box.json", "draft", "target"]]
    assert (root / "draft" / "model.safetensors").read_bytes() == b"rebuiltdraft"


def test_an_unwritable_parent_and_the_default_directory(tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    with pytest.raises(BoxError, match="cannot write the box next to .*; choose a writable directory with --cache-dir "
                                       "or BOX_DIR"):
        ensure(blocked / "box")
    monkeypatch.setenv("BOX_DIR", str(tmp_path / "elsewhere"))
    assert cache_dir("BOX_DIR", "box", "v1") == tmp_path / "elsewhere"
    monkeypatch.delenv("BOX_DIR")
    assert cache_dir("BOX_DIR", "box", "v1").parts[-4:] == (".cache", "accept-heads", "box", "v1")


def test_file_hashes_of_named_files_and_of_a_whole_directory(tmp_path):
    record = fill(tmp_path)
    assert file_hashes(tmp_path, skip="box.json") == record["files"]
    name = "draft/model.safetensors"
    assert file_hashes(tmp_path, [name]) == {name: record["files"][name]}
