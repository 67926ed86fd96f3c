"""The ``README.md`` model card of an export directory, rendered from its artifacts' metadata.

An export directory (heads and SV profiles written by :mod:`decode.artifacts.serialization`, plus this card) is a valid
Hub model repo: the card has YAML front matter (``library_name``, ``tags``, ``base_model`` when the
draft is a hub id) and says what each artifact is, the models and data it was made with, its dev
metrics, its stop rule and how to load it. Everything comes from the metadata; nothing is estimated here.
"""

from __future__ import annotations

import json
from typing import Any

from decode import rules
from decode.artifacts.hub import is_hub_id
from decode.sampling import Sampling

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


def render_card(artifacts: dict[str, dict[str, Any]], repo_id: str | None = None) -> str:
    """The card of a directory holding ``artifacts`` (file name → metadata); ``repo_id`` goes into the snippets."""
    if not artifacts:
        raise ValueError("a model card needs at least one head or SV profile")
    docs = list(artifacts.values())
    drafts = sorted({str(doc.get("draft")) for doc in docs})
    title = repo_id or "Acceptance predictors for " + ", ".join(f"`{draft}`" for draft in drafts)
    parts = [_front_matter(docs, drafts), MARKER, "", f"# {title}", ""]
    parts += [
        "Acceptance predictors for speculative decoding, written by `decode.artifacts.serialization` (accept-heads). "
        "Each file is a safetensors file whose header holds the metadata this card was generated from; "
        "`decode.load_head` / `decode.load_profile` check it against the draft, tokenizer, rule and sampling "
        "you decode with.",
        "",
        "| file | artifact | rule | draft |",
        "|---|---|---|---|",
    ]
    for name, doc in artifacts.items():
        parts.append(f"| `{name}` | {_artifact_title(doc)} | {_rule(doc)} | `{doc.get('draft')}` |")
    for name, doc in artifacts.items():
        parts += ["", *_section(name, doc, repo_id)]
    return "\n".join(parts) + "\n"


def _front_matter(docs: list[dict[str, Any]], drafts: list[str]) -> str:
    tags = ["speculative-decoding"]
    for doc in docs:
        tags += _TAGS.get(doc.get("kind", ""), []) + [f"rule-{doc.get('rule', {}).get('name')}"]
    lines = ["---", "library_name: accept-heads", "tags:", *[f"- {tag}" for tag in dict.fromkeys(tags)]]
    base = [draft for draft in drafts if is_hub_id(draft)]
    if len(base) == 1:
        lines.append(f"base_model: {json.dumps(base[0])}")
    elif base:
        lines += ["base_model:", *[f"- {json.dumps(draft)}" for draft in base]]
    return "\n".join([*lines, "---"])


def _section(name: str, doc: dict[str, Any], repo_id: str | None) -> list[str]:
    kind = doc.get("kind")
    lines = [f"## `{name}`: {_artifact_title(doc)}", "", _what(doc), "", "### Made for", "",
             "| role | model |", "|---|---|"]
    for role in ("draft", "target", "companion"):
        if doc.get(role):
            revision = doc.get(f"{role}_revision")
            lines.append(f"| {role} | `{doc[role]}`{f' (revision `{revision}`)' if revision else ''} |")
    lines += [f"| tokenizer SHA-256 | `{doc.get('tokenizer_hash')}` |", "", *_rule_and_sampling(doc), "",
              *_training_data(doc), ""]
    if kind == "head":
        lines += [*_dev_metrics(doc), "", *_stop_rule(doc), ""]
        if doc.get("train_config"):
            lines += ["### Training recipe", "",
                      *[f"- {part}: `{json.dumps(value, sort_keys=True)}`" for part, value in doc["train_config"].items()],
                      ""]
    else:
        lines += [*_information(doc), ""]
    lines += [*_how_to_load(name, doc, repo_id), "",
              f"Written by accept-heads `{doc.get('code_version')}`, artifact format {doc.get('format_version')}."]
    return lines


def _artifact_title(doc: dict[str, Any]) -> str:
    title = _TITLES.get(doc.get("kind", ""), str(doc.get("kind")))
    return f"{title}, {doc['head_config']['timing']}-verification timing" if "head_config" in doc else title


def _what(doc: dict[str, Any]) -> str:
    if doc.get("kind") != "head":
        bins = doc.get("bins", [None, None])
        return (
            f"Mean target acceptance per bin of the companion's indicators (X, Y) — {bins[0]} × {bins[1]} bins "
            f"(requested {doc.get('requested_bins')}, bins with fewer than {doc.get('min_bin_count')} positions backed "
            f"off) — with the target's verification latency for L = 1..{doc.get('k_max')} measured on "
            f"{doc.get('latency_device')}. SV drafts K candidates, scores them with the companion and verifies the "
            "goodput-optimal prefix."
        )
    config = doc["head_config"]
    if config["timing"] == "post":
        reads = ("the draft's final hidden state of the forward that consumed the candidate `y_i` "
                 "(a round that stops early costs one draft call more than fixed-K drafting)")
    else:
        features = [*config.get("features", []), *(["companion X, Y"] if config.get("companion_features") else [])]
        reads = (f"the draft hidden state that produced `q_i` plus features of the candidate `y_i` "
                 f"({', '.join(features) or 'none'}); it costs no extra draft call")
    return (
        "Predicts the probability that the target accepts each drafted token `y_i` under the rule below, "
        f"from {reads}. MLP of depth {config['depth']} on a draft hidden size of {config['hidden_size']}."
    )


def _rule(doc: dict[str, Any]) -> str:
    spec = doc.get("rule", {})
    params = ", ".join(f"{k}={v!r}" for k, v in spec.get("params", {}).items())
    return f"`{spec.get('name')}`" + (f" ({params})" if params else "")


def _sampling_call(sampling: dict[str, Any]) -> str:
    return "Sampling(" + ", ".join(f"{k}={v!r}" for k, v in sampling.items()) + ")"


def _rule_and_sampling(doc: dict[str, Any]) -> list[str]:
    spec, sampling = doc.get("rule", {}), doc.get("sampling", {})
    lines = ["### Verification rule and sampling", "", f"- Rule: {_rule(doc)}; labels are this rule's acceptances.",
             f"- Training responses sampled under `{_sampling_call(sampling)}`."]
    try:
        decoding = rules.from_spec(spec["name"], **spec.get("params", {})).transform(Sampling.from_dict(sampling))
    except (KeyError, TypeError, ValueError):
        return lines
    lines.append(f"- Decoding with this rule generates under `{_sampling_call(decoding.to_dict())}`; the loader warns "
                 "when the sampling you decode with generates otherwise.")
    return lines


def _training_data(doc: dict[str, Any]) -> list[str]:
    data = doc.get("training_data") or {}
    if not data:
        return ["### Training data", "", "Not recorded in the metadata."]
    positions = ", ".join(f"{split} {count}" for split, count in (data.get("positions") or {}).items())
    return [
        "### Training data", "",
        f"- Collected data `{data.get('data_dir')}` (experiment `{data.get('exp_name')}`, seed {doc.get('seed')}).",
        f"- `manifest.json` SHA-256: `{data.get('manifest_sha256')}`.",
        f"- Labelled positions: {positions or 'not recorded'}.",
    ]


def _number(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "—" if value is None else str(value)


def _dev_metrics(doc: dict[str, Any]) -> list[str]:
    metrics = doc.get("dev_metrics") or {}
    if not metrics:
        return ["### Dev metrics", "", "None recorded."]
    lines = ["### Dev metrics", "", "| metric | value | meaning |", "|---|---|---|"]
    for key, value in metrics.items():
        shown = "undefined (one class)" if value is None else _number(value)
        lines.append(f"| `{key}` | {shown} | {_METRICS.get(key.split('/')[-1], '')} |")
    dev = ((doc.get("training_data") or {}).get("positions") or {}).get("dev")
    count = dev if dev is not None else "an unrecorded number of"
    lines += ["", f"Point estimates on the dev split ({count} labelled positions, correlated within responses). "
              "The metadata holds no per-position predictions, so no 95 % interval is given here; "
              "`python -m accept_heads.evaluate` reports decoding results with paired-bootstrap intervals "
              "over prompts."]
    return lines


def _stop_rule(doc: dict[str, Any]) -> list[str]:
    threshold, k_min, k_max = doc.get("threshold"), doc.get("k_min"), doc.get("k_max")
    lines = ["### Stop rule", ""]
    if threshold is None:
        lines.append(f"Keep drafting while `1 − Π_j P̂_j ≤ h`, between {k_min} and {k_max} candidates. No threshold "
                     "was chosen for this head: choose `h` on your own prompts.")
        return lines
    calibration = doc.get("calibration") or {}
    lines.append(f"Keep drafting while `1 − Π_j P̂_j ≤ h` with **h = {_number(threshold)}**, between {k_min} "
                 f"and {k_max} candidates; `h` maximised modelled throughput on {calibration.get('prompts')} dev "
                 f"prompts ({calibration.get('max_new_tokens')} new tokens each) at costs "
                 f"`{json.dumps(calibration.get('cost'), sort_keys=True)}`.")
    table = calibration.get("table") or []
    if table:
        columns = ["threshold", *(column for column in table[0] if column != "threshold")]
        lines += ["", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        for row in table:
            cells = [_number(row.get(c)) for c in columns]
            chosen = row.get("threshold") == threshold
            lines.append("| " + " | ".join(f"**{c}**" if chosen else c for c in cells) + " |")
    return lines


def _information(doc: dict[str, Any]) -> list[str]:
    lines = ["### Information about acceptance", ""]
    information = doc.get("information") or {}
    if not information:
        return [*lines, "None recorded."]
    lines += ["| split | H(A) bits | H(A given X, Y) bits | gain | gain fraction | plug-in gain |",
              "|---|---|---|---|---|---|"]
    for split, values in information.items():
        cells = [_number(values.get(k)) for k in ("h_a", "h_a_given_xy", "gain", "gain_fraction", "gain_plugin")]
        lines.append(f"| {split} | " + " | ".join(cells) + " |")
    lines += ["", "Over the labelled positions (no interval in the metadata); the gain is shuffle-corrected (the "
              "plug-in gain minus its mean with the acceptance bins shuffled), the plug-in gain is biased upward. "
              "Stop rule: "
              f"`decode.policies.SV(profile, k={doc.get('k_max')})` verifies the goodput-optimal prefix of the "
              "K drafted candidates, from the profile's acceptance and latency tables."]
    return lines


def _how_to_load(name: str, doc: dict[str, Any], repo_id: str | None) -> list[str]:
    kind = doc.get("kind")
    repo = repo_id or _PLACEHOLDER
    filename = "" if name == DEFAULT_FILES.get(kind, name) else f", filename={name!r}"
    spec = doc.get("rule", {})
    rule_args = "".join(f", {k}={v!r}" for k, v in spec.get("params", {}).items())
    models = [f'draft = load_causal_lm("{doc.get("draft")}")', f'tokenizer = load_tokenizer("{doc.get("draft")}")',
              f'target = load_causal_lm("{doc.get("target")}")']
    if kind == "head":
        load = f'head = decode.load_head("{repo}"{filename}, draft=draft, tokenizer=tokenizer)'
        local = 'head = decode.load_head("path/to/this/folder", draft=draft, tokenizer=tokenizer)'
        threshold = doc.get("threshold")
        policy = ("policy = decode.policies.Head(head, threshold=0.5)  # no h recorded: choose it on your prompts"
                  if threshold is None else
                  f"policy = decode.policies.Head(head)  # at the h = {threshold!r} it records, {doc.get('k_min', 1)} "
                  f"to {doc.get('k_max', 20)} candidates")
        companion = ", companion=companion" if doc["head_config"].get("companion_features") else ""
    else:
        load = f'profile = decode.load_profile("{repo}"{filename}, tokenizer=tokenizer)'
        local = 'profile = decode.load_profile("path/to/this/folder", tokenizer=tokenizer)'
        policy = f"policy = decode.policies.SV(profile, k={doc.get('k_max')})"
        companion = ", companion=companion"
    if companion:
        models.append(f'companion = load_causal_lm("{doc.get("companion")}")')
    return [
        "### How to load", "", "```python", "import decode",
        "from decode.artifacts.hub import load_causal_lm, load_tokenizer", "",
        *models, f"{load}  # add revision=... to pin a commit",
        "# or from a local copy of this folder (or the .safetensors file itself):", f"# {local}",
        policy,
        f'rule = decode.rules.from_spec("{spec.get("name")}"{rule_args})',
        f"decoder = decode.SpeculativeDecoder(target, draft, rule=rule, policy=policy{companion}, "
        f"sampling=decode.{_sampling_call(doc.get('sampling', {}))})",
        "```",
    ]

