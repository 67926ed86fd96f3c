"""What an evaluation decodes with: the prompt sets and the exported heads / SV profiles.

:func:`load_sets` encodes dev (selection), test and the out-of-distribution sets (``prompts.ood``);
:func:`discover` loads every head and profile under ``paths.head_dir`` and validates it against the
models. Both are rebuilt identically in every worker process (:mod:`accept_heads.evaluation.executor`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from ahconf.schema import ConfigError, DecodingConfig, PromptsConfig
from data_gen.prompts import available_splits, load_prompts, parse_source
from decode.artifacts.serialization import load_head, load_profile
from decode.head import AcceptanceHead
from decode.metadata import HeadMetadata, ProfileMetadata
from decode.profile import SVProfile
from decode.sampling import Sampling
from runtime.encoding import EncodedPrompt, encode_prompts
from runtime.models import Trio

#: Load this many times the wanted count, so that prompts skipped as too long can be replaced.
_OVERSAMPLE = 4


@dataclass(frozen=True)
class PromptSetDescription:
    """Where a prompt set's prompts come from and which ones were used."""

    name: str  # dev, test, or the prompts.ood spec (e.g. builtin:module)
    role: str  # dev, test or ood
    source: str  # the prompt source (builtin, a hub dataset, a file)
    style: str | None  # the builtin source's style (None: none)
    split: str  # the split read
    count: int  # prompts used
    skipped: dict[str, int]  # prompts left out, by reason (e.g. too long)
    prompt_ids: list[str]  # the prompts used, in order


@dataclass(frozen=True)
class PromptSet:
    """Encoded prompts of one set; ``role`` is ``dev``, ``test`` or ``ood``."""

    name: str
    role: str
    source: str
    style: str | None
    split: str
    prompts: list[EncodedPrompt]
    skipped: dict[str, int]

    def key(self) -> dict[str, str]:
        """The set's columns in a results row."""
        return {"role": self.role, "split": self.split}

    def describe(self) -> PromptSetDescription:
        """Metadata: where the prompts come from and which ones were used."""
        return PromptSetDescription(self.name, self.role, self.source, self.style, self.split, len(self.prompts),
                                    dict(self.skipped), [p.prompt_id for p in self.prompts])


def ood_split(source: str) -> str:
    """The split an out-of-distribution source is read from: ``test`` when it has one, else its last."""
    splits = available_splits(source)
    return "test" if "test" in splits else splits[-1]


def _load(p: PromptsConfig, seed: int, tokenizer: PreTrainedTokenizerBase, budget: int, *, name: str, role: str,
          source: str, style: str | None, split: str, count: int) -> PromptSet:
    raw = load_prompts(source, split, size=count * _OVERSAMPLE, style=style, seed=seed,
                       revision=p.revision if role != "ood" else None, text_field=p.text_field,
                       sizes=p.sizes if role != "ood" else None)
    encoded, skipped = encode_prompts(raw, tokenizer, p.template, budget, p.truncation, p.instruction)
    if not encoded:
        raise ValueError(f"prompt set {name!r}: every prompt was skipped ({skipped}); raise prompts.max_prompt_tokens")
    return PromptSet(name, role, source, style, split, encoded[:count], skipped)


def _budget(p: PromptsConfig, d: DecodingConfig, context: int) -> int:
    budget = min(p.max_prompt_tokens, context - d.max_new_tokens - 2)
    if budget < 1:
        raise ValueError(f"decoding.max_new_tokens={d.max_new_tokens} leaves no room for a prompt "
                         f"in the models' context of {context} tokens")
    return budget


def load_split(p: PromptsConfig, d: DecodingConfig, seed: int, tokenizer: PreTrainedTokenizerBase, context: int,
               split: str, count: int) -> PromptSet:
    """``count`` prompts of one split of the configured source (e.g. ``train``, for fitting on the decoder's rounds)."""
    return _load(p, seed, tokenizer, _budget(p, d, context), name=split, role=split, source=p.source, style=p.style,
                 split=split, count=count)


def load_sets(p: PromptsConfig, d: DecodingConfig, seed: int, tokenizer: PreTrainedTokenizerBase,
              context: int) -> list[PromptSet]:
    """dev, test (the configured source) and every ``prompts.ood`` set, sized by ``decoding.prompts``."""
    sizes = d.prompts
    sets = [load_split(p, d, seed, tokenizer, context, split, sizes[split]) for split in ("dev", "test")]
    return sets + load_ood(p, d, seed, tokenizer, context, sizes["ood"])


def load_ood(p: PromptsConfig, d: DecodingConfig, seed: int, tokenizer: PreTrainedTokenizerBase, context: int,
             count: int) -> list[PromptSet]:
    """``count`` prompts of every ``prompts.ood`` set."""
    budget = _budget(p, d, context)
    sets = []
    for spec in p.ood:
        source, style = parse_source(spec)
        sets.append(_load(p, seed, tokenizer, budget, name=spec, role="ood", source=source, style=style,
                          split=ood_split(source), count=count))
    return sets


@dataclass(frozen=True)
class HeadRecord:
    """An evaluated head as the results record it: its file and what the file records."""

    path: str  # its head.safetensors
    metadata: HeadMetadata  # its shape, rule, sampling, dev metrics, training data and code version


@dataclass(frozen=True)
class ProfileRecord:
    """An evaluated SV profile as the results record it: its file, what the file records and its tables."""

    path: str  # its profile.safetensors
    metadata: ProfileMetadata  # its bins, rule, k_max, information gain and latency device
    x_edges: list[float]  # [nx + 1] X-bin edges
    y_edges: list[float]  # [ny + 1] Y-bin edges
    table: list[list[float]]  # [nx][ny] mean target acceptance per bin
    counts: list[list[float]]  # [nx][ny] positions per bin
    latency: list[float]  # [L_max] target verification seconds for L = 1..L_max
    batch_sizes: list[int] | None = None  # [nB] batch sizes of the batch latency table (None: none measured)
    batch_latency_table: list[list[float]] | None = None  # [nB][L] target forwards of B rows x l tokens, seconds

    @classmethod
    def of(cls, path: Path, profile: SVProfile) -> ProfileRecord:
        """The record of ``profile``, loaded from ``path``."""
        return cls(str(path), profile.metadata, **{key: tensor.tolist() for key, tensor in profile.tensors().items()})


@dataclass
class Artifacts:
    """Exported heads and SV profiles found under ``paths.head_dir``, by name."""

    heads: dict[str, AcceptanceHead] = field(default_factory=dict)
    profiles: dict[str, SVProfile] = field(default_factory=dict)
    head_files: dict[str, Path] = field(default_factory=dict)  # each head's head.safetensors
    profile_files: dict[str, Path] = field(default_factory=dict)  # each profile's profile.safetensors

    def head_records(self) -> dict[str, HeadRecord]:
        """Each head's file and metadata, for the results."""
        return {name: HeadRecord(str(self.head_files[name]), head.metadata) for name, head in self.heads.items()}

    def profile_records(self) -> dict[str, ProfileRecord]:
        """Each profile's file, metadata and tables, for the results."""
        return {name: ProfileRecord.of(self.profile_files[name], profile) for name, profile in self.profiles.items()}


def head_name(path: Path, root: Path, timing: str) -> str:
    """A head's name: its folder under ``paths.head_dir``, or its timing when it lies in the folder itself."""
    relative = path.parent.relative_to(root).as_posix()
    return timing if relative == "." else relative


def discover(head_dir: str, trio: Trio, sampling: Sampling, notes: dict[str, str], verify: bool = True) -> Artifacts:
    """Load every ``head.safetensors`` / ``profile.safetensors`` under ``paths.head_dir`` (validated; checked against
    the sha256 each records unless ``verify`` is False).

    Artifacts that need the companion are left out (with a note) when no companion is configured.
    """
    root = Path(head_dir)
    artifacts = Artifacts()
    if not root.is_dir():
        notes["artifacts"] = f"no {root}: no head or SV profile to evaluate"
        return artifacts
    for path in sorted(root.rglob("head.safetensors")):
        try:
            head = load_head(path, draft=trio.draft, tokenizer=trio.tokenizer, sampling=sampling, verify=verify)
        except ValueError as error:
            raise ConfigError(f"cannot evaluate {path} with these models: {error}") from error
        name = head_name(path, root, head.config.timing)
        if head.config.companion_features and trio.companion is None:
            notes[f"head[{name}]"] = f"head[{name}] reads companion features but no companion is configured; skipped"
            continue
        artifacts.heads[name] = head.to(trio.draft.device)
        artifacts.head_files[name] = path
    for path in sorted(root.rglob("profile.safetensors")):
        try:
            profile = load_profile(path, tokenizer=trio.tokenizer, sampling=sampling, verify=verify)
        except ValueError as error:
            raise ConfigError(f"cannot evaluate {path} with these models: {error}") from error
        name = head_name(path, root, "profile")
        if trio.companion is None:
            notes[f"profile[{name}]"] = (f"SV profile[{name}] needs the companion model, which is not configured; "
                                         "skipped")
            continue
        artifacts.profiles[name] = profile
        artifacts.profile_files[name] = path
    return artifacts
