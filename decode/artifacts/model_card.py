"""The ``README.md`` model card of an export directory, rendered from its artifacts' metadata.

An export directory (heads and SV profiles written by :mod:`decode.artifacts.serialization`, plus this card) is a valid
Hub model repo: the card has YAML front matter (``library_name``, ``tags``, ``base_model`` when the
draft is a hub id) and says what each artifact is, the models and data it was made with, its dev
metrics, its stop rule and how to load it. Everything comes from the metadata and a head's threshold choice (the ``h``
the evaluation chose on dev, :mod:`decode.artifacts.threshold_choice`); nothing is estimated here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from decode.artifacts.hub import is_hub_id
from decode.artifacts.threshold_choice import ThresholdChoice, choice_name
from decode.metadata import FORMAT_VERSION, HeadMetadata, ProfileMetadata
from decode.sampling import Sampling

Metadata = HeadMetadata | ProfileMetadata

CARD_FILE = "README.md"
#: First body line of a generated card: a README without it is the user's and is never overwritten.
MARKER = "<!-- accept-heads: generated card; delete this line to keep hand edits from being regenerated -->"
DEFAULT_FILES = {"head": "head.safetensors", "sv_profile": "profile.safetensors"}
_PLACEHOLDER = "<org>/<name>"
_TITLES = {"head": "SpecDec++ acceptance head", "sv_profile": "SV profile (Speculative Verification)"}
_TAGS = {"head": ["acceptance-head", "specdec-plus-plus"], "sv_profile": ["sv-profile", "speculative-verification"]}
_METRICS = {
    "binary_kl": "mean KL(Bern(a) ‖ Bern(ŝ)) in nats (the paper's metric; lower is better)",
    "binary_kl_constant": "the same for the constant predictor ŝ = mean train label (the baseline to beat)",
    "auroc": "AUROC of ŝ against sampled accept/reject outcomes",
    "ece": "expected calibration error over 15 bins, against the soft labels",
    "weighted_bce": "the training loss (weighted BCE) on dev",
    "mean_pred": "mean predicted acceptance",
    "mean_label": "mean acceptance label",
}


def is_generated(text: str) -> bool:
    """Whether a README's text is a card rendered here (and so may be regenerated)."""
    return MARKER in text.splitlines()


def render_card(artifacts: dict[str, Metadata], repo_id: str | None = None,
                choices: Mapping[str, ThresholdChoice] | None = None) -> str:
    """The card of a directory holding ``artifacts`` (file name → metadata) and the heads' threshold ``choices``
    (file name → the record of that file; a head without one has no ``h`` yet); ``repo_id`` goes into the snippets."""
    if not artifacts:
        raise ValueError("a model card needs at least one head or SV profile")
    records = list(artifacts.values())
    drafts = sorted({record.draft for record in records})
    title = repo_id or "Acceptance predictors for " + ", ".join(f"`{draft}`" for draft in drafts)
    parts = [_front_matter(records, drafts), MARKER, "", f"# {title}", ""]
    parts += [
        "Acceptance predictors for speculative decoding, written by `decode.artifacts.serialization` (accept-heads). "
        "Each file is a safetensors file whose header holds the metadata this card was generated from; "
        "`decode.load_head` / `decode.load_profile` check it against the draft, tokenizer, rule and sampling "
        "you decode with.",
        "",
        "| file | artifact | rule | draft |",
        "|---|---|---|---|",
    ]
    for name, record in artifacts.items():
        parts.append(f"| `{name}` | {_artifact_title(record)} | {_rule(record)} | `{record.draft}` |")
    for name, record in artifacts.items():
        parts += ["", *_section(name, record, repo_id, (choices or {}).get(name))]
    return "\n".join(parts) + "\n"


def _front_matter(records: list[Metadata], drafts: list[str]) -> str:
    tags = ["speculative-decoding"]
    for record in records:
        tags += _TAGS[record.kind] + [f"rule-{record.rule['name']}"]
    lines = ["---", "library_name: accept-heads", "tags:", *[f"- {tag}" for tag in dict.fromkeys(tags)]]
    base = [draft for draft in drafts if is_hub_id(draft)]
    if len(base) == 1:
        lines.append(f"base_model: {json.dumps(base[0])}")
    elif base:
        lines += ["base_model:", *[f"- {json.dumps(draft)}" for draft in base]]
    return "\n".join([*lines, "---"])


def _section(name: str, record: Metadata, repo_id: str | None, choice: ThresholdChoice | None) -> list[str]:
    lines = [f"## `{name}`: {_artifact_title(record)}", "", _what(record), "", "### Made for", "",
             "| role | model |", "|---|---|"]
    for role, model, revision in (("draft", record.draft, record.draft_revision), ("target", record.target, None),
                                  ("companion", record.companion, None)):
        if model:
            lines.append(f"| {role} | `{model}`{f' (revision `{revision}`)' if revision else ''} |")
    lines += [f"| tokenizer SHA-256 | `{record.tokenizer_hash}` |", "", *_rule_and_sampling(record), "",
              *_training_data(record), ""]
    if isinstance(record, HeadMetadata):
        lines += [*_dev_metrics(record), "", *_stop_rule(name, record, choice), ""]
        if record.train_config:
            recipe = record.train_config.items()
            lines += ["### Training recipe", "",
                      *[f"- {part}: `{json.dumps(value, sort_keys=True)}`" for part, value in recipe], ""]
    else:
        lines += [*_information(record), ""]
    lines += [*_how_to_load(name, record, repo_id, choice), "",
              f"Written by accept-heads `{record.code_version}`, artifact format {FORMAT_VERSION}."]
    return lines


def _artifact_title(record: Metadata) -> str:
    if isinstance(record, HeadMetadata):
        return f"{_TITLES[record.kind]}, {record.head_config.timing}-verification timing"
    return _TITLES[record.kind]


def _what(record: Metadata) -> str:
    if isinstance(record, ProfileMetadata):
        requested = None if record.requested_bins is None else list(record.requested_bins)
        return (
            f"Mean target acceptance per bin of the companion's indicators (X, Y) — {record.bins[0]} × "
            f"{record.bins[1]} bins (requested {requested}, bins with fewer than {record.min_bin_count} positions "
            f"backed off) — with the target's verification latency for L = 1..{record.k_max} measured on "
            f"{record.latency_device}. SV drafts K candidates, scores them with the companion and verifies the "
            "goodput-optimal prefix."
        )
    config = record.head_config
    if config.timing == "post":
        reads = ("the draft's final hidden state of the forward that consumed the candidate `y_i` "
                 "(a round that stops early costs one draft call more than fixed-K drafting)")
    else:
        features = [*config.features, *(["companion X, Y"] if config.companion_features else [])]
        reads = (f"the draft hidden state that produced `q_i` plus features of the candidate `y_i` "
                 f"({', '.join(features) or 'none'}); it costs no extra draft call")
    return (
        "Predicts the probability that the target accepts each drafted token `y_i` under the rule below, "
        f"from {reads}. MLP of depth {config.depth} on a draft hidden size of {config.hidden_size}."
    )


def _rule(record: Metadata) -> str:
    params = ", ".join(f"{k}={v!r}" for k, v in record.rule["params"].items())
    return f"`{record.rule['name']}`" + (f" ({params})" if params else "")


def _sampling_call(sampling: Sampling) -> str:
    return "Sampling(" + ", ".join(f"{k}={v!r}" for k, v in sampling.to_dict().items()) + ")"


def _rule_and_sampling(record: Metadata) -> list[str]:
    lines = ["### Verification rule and sampling", "", f"- Rule: {_rule(record)}; labels are this rule's acceptances.",
             f"- Training responses sampled under `{_sampling_call(record.sampling)}`."]
    try:
        decoding = record.build_rule().transform(record.sampling)
    except (KeyError, TypeError, ValueError):
        return lines
    lines.append(f"- Decoding with this rule generates under `{_sampling_call(decoding)}`; the loader warns "
                 "when the sampling you decode with generates otherwise.")
    return lines


def _training_data(record: Metadata) -> list[str]:
    data = record.training_data
    if data is None:
        return ["### Training data", "", "Not recorded in the metadata."]
    positions = ", ".join(f"{split} {count}" for split, count in data.positions.items())
    return [
        "### Training data", "",
        f"- Collected data of experiment `{data.exp_name}` (seed {record.seed}).",
        f"- `manifest.json` SHA-256: `{data.manifest_sha256}`.",
        f"- Labelled positions: {positions or 'not recorded'}.",
    ]


def _number(value: float | int | str | None) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "—" if value is None else str(value)


def _dev_metrics(record: HeadMetadata) -> list[str]:
    if not record.dev_metrics:
        return ["### Dev metrics", "", "None recorded."]
    lines = ["### Dev metrics", "", "| metric | value | meaning |", "|---|---|---|"]
    for key, value in record.dev_metrics.items():
        shown = "undefined (one class)" if value is None else _number(value)
        lines.append(f"| `{key}` | {shown} | {_METRICS.get(key.split('/')[-1], '')} |")
    dev = record.training_data.positions.get("dev") if record.training_data is not None else None
    count = dev if dev is not None else "an unrecorded number of"
    lines += ["", f"Point estimates on the dev split ({count} labelled positions, correlated within responses). "
              "The metadata holds no per-position predictions, so no 95 % interval is given here; "
              "`python -m accept_heads.evaluate` reports decoding results with paired-bootstrap intervals "
              "over prompts."]
    return lines


#: The columns of a threshold choice's rows as the card lists them (its per-prompt records stay in the file).
_CHOICE_COLUMNS = ["h", "generated", "draft_calls", "target_calls", "discarded", "modelled_s", "throughput"]


def _stop_rule(name: str, record: HeadMetadata, choice: ThresholdChoice | None) -> list[str]:
    lines = ["### Stop rule", ""]
    rule = f"Keep drafting while `1 − Π_j P̂_j ≤ h`, between {record.k_min} and {record.k_max} candidates"
    if choice is None:
        lines.append(f"{rule}. `h` is chosen on dev by `python -m accept_heads.evaluate`, which records it beside this "
                     f"file (`{choice_name(name)}`); none is recorded for it yet: evaluate it, or choose `h` on your "
                     "own prompts.")
        return lines
    lines.append(f"{rule}, with **h = {_number(choice.threshold)}**, chosen by `python -m accept_heads.evaluate` "
                 f"(`{choice_name(name)}`): `h` maximised modelled throughput on {choice.prompts.get('count')} dev "
                 f"prompts ({choice.settings.get('max_new_tokens')} new tokens each) at costs "
                 f"`{json.dumps(choice.cost, sort_keys=True)}`.")
    lines += ["", "| " + " | ".join(_CHOICE_COLUMNS) + " |", "|" + "---|" * len(_CHOICE_COLUMNS)]
    for row in choice.rows:
        cells = [_number(row[column]) for column in _CHOICE_COLUMNS]
        chosen = row["h"] == choice.threshold
        lines.append("| " + " | ".join(f"**{c}**" if chosen else c for c in cells) + " |")
    return lines


def _information(record: ProfileMetadata) -> list[str]:
    lines = ["### Information about acceptance", ""]
    if not record.information:
        return [*lines, "None recorded."]
    lines += ["| split | H(A) bits | H(A given X, Y) bits | gain | gain fraction | plug-in gain |",
              "|---|---|---|---|---|---|"]
    for split, gain in record.information.items():
        cells = [_number(getattr(gain, k)) for k in ("h_a", "h_a_given_xy", "gain", "gain_fraction", "gain_plugin")]
        lines.append(f"| {split} | " + " | ".join(cells) + " |")
    lines += ["", "Over the labelled positions (no interval in the metadata); the gain is shuffle-corrected (the "
              "plug-in gain minus its mean with the acceptance bins shuffled), the plug-in gain is biased upward. "
              "Stop rule: "
              f"`decode.policies.SV(profile, k={record.k_max})` verifies the goodput-optimal prefix of the "
              "K drafted candidates, from the profile's acceptance and latency tables."]
    return lines


def _how_to_load(name: str, record: Metadata, repo_id: str | None, choice: ThresholdChoice | None) -> list[str]:
    repo = repo_id or _PLACEHOLDER
    filename = "" if name == DEFAULT_FILES[record.kind] else f", filename={name!r}"
    rule_args = "".join(f", {k}={v!r}" for k, v in record.rule["params"].items())
    models = [f'draft = load_causal_lm("{record.draft}")', f'tokenizer = load_tokenizer("{record.draft}")',
              f'target = load_causal_lm("{record.target}")']
    if isinstance(record, HeadMetadata):
        load = f'head = decode.load_head("{repo}"{filename}, draft=draft, tokenizer=tokenizer)'
        local = 'head = decode.load_head("path/to/this/folder", draft=draft, tokenizer=tokenizer)'
        low, high = record.k_range(1, 20)
        policy = ("policy = decode.policies.Head(head, threshold=0.5)  # no h chosen yet: choose it on your prompts"
                  if choice is None else
                  f"policy = decode.policies.Head(head)  # at the h = {choice.threshold!r} chosen on dev, {low} "
                  f"to {high} candidates")
        companion = ", companion=companion" if record.head_config.companion_features else ""
    else:
        load = f'profile = decode.load_profile("{repo}"{filename}, tokenizer=tokenizer)'
        local = 'profile = decode.load_profile("path/to/this/folder", tokenizer=tokenizer)'
        policy = f"policy = decode.policies.SV(profile, k={record.k_max})"
        companion = ", companion=companion"
    if companion:
        models.append(f'companion = load_causal_lm("{record.companion}")')
    return [
        "### How to load", "", "```python", "import decode",
        "from decode.artifacts.hub import load_causal_lm, load_tokenizer", "",
        *models, f"{load}  # add revision=... to pin a commit",
        "# or from a local copy of this folder (or the .safetensors file itself):", f"# {local}",
        policy,
        f'rule = decode.rules.from_spec("{record.rule["name"]}"{rule_args})',
        f"decoder = decode.SpeculativeDecoder(target, draft, rule=rule, policy=policy{companion}, "
        f"sampling=decode.{_sampling_call(record.sampling)})",
        "```",
    ]
