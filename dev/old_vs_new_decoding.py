"""Old-vs-new decoder check: every rule × policy kind decodes the same tokens and stats at a git revision and here.

A refactor of the length policies (their classes, specs or registries) must not change a single decision. This
script checks out ``REV`` in a temporary git worktree, decodes a fixed set of prompts on micro random models (built
from fixed seeds, no files) with every rule × every policy kind that revision names (``policy_spec(kind, ...)``
builds each from its flat form, so today's kind names must still read here), in four modes — batch 1, batched,
batched at measured batch costs (the batch axis: the goodput stop decides for the batch, the survival budgets
decide), and the Speculative Ensemble's ``sd`` mode driven by the policy — with both draft kinds (a plain draft
and a feature draft reading the target's hidden states; the ``sd`` mode with the plain one) once in that worktree
and once in this tree, each in its own process, and compares the tokens, the per-row stats (wall times left out) and which cases are
refused, exactly (a refusal worded differently, e.g. naming the policy by another repr, is counted apart).

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python dev/old_vs_new_decoding.py 0e51fc7
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]

#: The flat form of each parameterised kind's spec (the artifact: the head or profile it reads).
VALUES = {"fixed": 3.0, "confidence": 0.5, "confidence-h": 0.5, "svip": 1.0, "adaedl": 0.1, "adaedl-budget": 0.1,
          "margin": 0.5, "head": 0.5, "head-online": 0.5, "perfect": 0.5}
HEAD_KINDS = ("head", "head-goodput", "head-budget", "head-online", "head-online-goodput", "head-online-budget")
MODES = ("alone", "batched", "batched-costs", "se-sd")
DRAFTS = ("plain", "feature")


def micro_lm(vocab: int, seed: int, hidden: int, layers: int) -> Any:
    """A random float32 Llama without special tokens (as the decoder tests' ``micro_lm``)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                         initializer_range=0.3, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return LlamaForCausalLM(config).eval()


def feature_draft(target: Any, seed: int, hidden: int) -> Any:
    """A random float32 feature draft reading ``target``'s last two hidden states (wherever its tree defines it)."""
    import torch

    try:
        from decode.drafts.feature_model import FeatureDraftConfig, FeatureDraftForCausalLM
    except ImportError:  # where the feature draft lived before the draft kinds became decode.drafts
        from decode.feature_draft import FeatureDraftConfig, FeatureDraftForCausalLM  # type: ignore[no-redef]

    torch.manual_seed(seed)
    layers = target.config.num_hidden_layers
    config = FeatureDraftConfig(
        vocab_size=target.config.vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256, initializer_range=0.3,
        bos_token_id=None, eos_token_id=None, pad_token_id=None, feature_layers=[layers - 1, layers],
        target_hidden_size=target.config.hidden_size, tie_word_embeddings=True)
    return FeatureDraftForCausalLM(config).eval()


def artifacts(draft: Any) -> tuple[dict[str, Any], Any]:
    """Two random heads (``pre`` with the candidate's features, ``post``) and an SV profile, from fixed seeds."""
    import torch

    from decode import AcceptanceHead, HeadConfig, SVProfile
    from decode.head import PRE_FEATURES

    torch.manual_seed(5)
    hidden = draft.config.hidden_size
    heads = {"pre": AcceptanceHead(HeadConfig(hidden, depth=2, timing="pre", features=PRE_FEATURES)),
             "post": AcceptanceHead(HeadConfig(hidden, depth=2, timing="post"))}
    profile = SVProfile(x_edges=torch.tensor([0.0, 0.5, 1.0]), y_edges=torch.tensor([0.0, 0.5, 1.0]),
                        table=torch.tensor([[0.2, 0.6], [0.5, 0.9]]), counts=torch.ones(2, 2),
                        latency=torch.tensor([1.0, 1.1, 1.2, 1.3, 1.4]))
    return heads, profile


def rules() -> dict[str, Any]:
    from decode import rules as r

    return {"speculative": r.Speculative(), "greedy": r.Greedy(), "fuzzy": r.Fuzzy(threshold=0.3),
            "weighted": r.Ensemble("weighted", weight=0.5), "contrastive": r.Ensemble("contrastive", mu=0.5)}


def cases(kinds: list[str]) -> list[tuple[str, float | None, str | None]]:
    """Every kind's flat form(s): each head kind once per head, SV at its profile's k and at k = 2."""
    out: list[tuple[str, float | None, str | None]] = []
    for kind in kinds:
        if kind in HEAD_KINDS:
            out += [(kind, VALUES.get(kind), head) for head in ("pre", "post")]
        elif kind == "sv":
            out += [(kind, None, "profile"), (kind, 2.0, "profile")]
        else:
            out.append((kind, VALUES.get(kind), None))
    return out


def plain(stats: Any) -> dict[str, Any]:
    """A stats record without its wall time and its compile record (how the forwards ran, which older trees lack)."""
    record = asdict(stats)
    for name in ("wall_time_s", "compile", "eager_reason"):
        record.pop(name, None)
    return record


def attempt(run: Any) -> Any:
    """``run()``'s result, or the refusal it raised (type and message)."""
    try:
        return run()
    except (ValueError, TypeError, NotImplementedError) as error:
        return {"refused": f"{type(error).__name__}: {error}"}


def worker(out: Path, prompts: int, max_new_tokens: int, kinds: list[str] | None) -> None:
    """Decode every case of ``kinds`` (None: every kind this tree registers) in this process's tree and write the
    records to ``out``."""
    import torch

    import decode
    from decode import EnsembleDecoder, SpeculativeDecoder
    from decode.batch_costs import BatchCosts
    from decode.costs import CostModel
    from decode.policy_specs import policy_kinds, policy_spec

    try:  # where PolicyInputs lived before the policies became a package by role
        from decode.policy_specs import PolicyInputs  # type: ignore[attr-defined]
    except ImportError:
        from decode.policies.base import PolicyInputs

    torch.set_num_threads(1)
    models = {"target": micro_lm(96, 21, 32, 2), "draft": micro_lm(96, 22, 16, 1), "companion": micro_lm(96, 23, 16, 1)}
    drafts = {"plain": models["draft"], "feature": feature_draft(models["target"], 24, 16)}
    heads, profile = artifacts(models["draft"])
    costs = CostModel(t_draft=0.2, t_target=1.0, t_companion=0.1)
    batch_costs = BatchCosts(batches=(1, 8), draft=(0.1, 0.12),
                             target=((1.0, 1.05, 1.1, 1.2, 1.3), (1.2, 1.3, 1.4, 1.5, 1.6)))
    generator = torch.Generator().manual_seed(7)
    texts = [torch.randint(0, 96, (n,), generator=generator) for n in (3, 1, 9, 4, 6, 2, 5)[:prompts]]
    seeds = [11 + 7 * i for i in range(len(texts))]
    kinds = list(policy_kinds()) if kinds is None else kinds
    records: dict[str, Any] = {"decode": decode.__file__, "kinds": kinds}

    def inputs(with_batch_costs: bool) -> Any:
        return PolicyInputs(heads=heads, profiles={"profile": profile}, costs=costs,
                            batch_costs=batch_costs if with_batch_costs else None, k_max=8)

    for rule_name, rule, (kind, value, artifact), mode, draft_kind in (
            (n, r, case, m, d) for n, r in rules().items() for case in cases(kinds) for m in MODES for d in DRAFTS
            if d == "plain" or m != "se-sd"):
        draft = drafts[draft_kind]
        key = f"{rule_name} | {kind}({value}, {artifact}) | {mode} | {draft_kind} draft"

        def run() -> Any:
            spec = policy_spec(kind, value, artifact)
            policy = spec.build(inputs(mode == "batched-costs" or kind.endswith("-budget")))
            if mode == "se-sd":
                decoder = EnsembleDecoder([models["draft"], models["target"]], ensemble=rule
                                          if rule_name in ("weighted", "contrastive") else None,
                                          mode="sd", policy=policy, eos_token_id=None)
                outs = [decoder.generate(p, max_new_tokens=max_new_tokens, seed=s) for p, s in
                        zip(texts, seeds)]
                return [{"tokens": o.sequences.reshape(-1).tolist(), "stats": plain(o.stats)} for o in outs]
            companion = models["companion"] if policy.companion is not None else None
            decoder = SpeculativeDecoder(models["target"], draft, rule=rule, policy=policy,
                                         companion=companion, eos_token_id=None)
            if mode == "alone":
                outs = [decoder.generate(p, max_new_tokens=max_new_tokens, seed=s) for p, s in
                        zip(texts, seeds)]
                return [{"tokens": o.sequences.reshape(-1).tolist(), "stats": plain(o.stats)} for o in outs]
            out = decoder.generate(texts, max_new_tokens=max_new_tokens, seed=seeds)
            return [{"tokens": s.reshape(-1).tolist(), "stats": plain(st)} for s, st in
                    zip(out.sequences, out.stats)]

        records[key] = attempt(run)
    out.write_text(json.dumps(records))


def decode_in(tree: Path, prompts: int, max_new_tokens: int, kinds: list[str] | None = None) -> dict[str, Any]:
    """Run the worker with ``tree``'s packages first on the path (over ``kinds``; None: the tree's own); its records,
    the kinds under ``"kinds"``."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "records.json"
        env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
        listed = ["--kinds", ",".join(kinds)] if kinds is not None else []
        subprocess.run([sys.executable, str(HERE), "--worker", str(out), "--prompts", str(prompts),
                        "--max-new-tokens", str(max_new_tokens), *listed], cwd=tree, env=env, check=True)
        records = json.loads(out.read_text())
    where = records.pop("decode")
    if not Path(where).resolve().is_relative_to(tree.resolve()):
        raise RuntimeError(f"the worker for {tree} imported decode from {where}")
    return records


def compare(old: dict[str, Any], new: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The cases that differ (or are missing on one side), one line each; and the cases both refuse in other words
    (the policy's repr in the message)."""
    lines, worded = [], []
    for key in sorted(set(old) | set(new)):
        if key not in new or key not in old:
            lines.append(f"{key}: only in the {'old' if key in old else 'new'} revision")
        elif old[key] != new[key]:
            a, b = old[key], new[key]
            if isinstance(a, dict) and isinstance(b, dict):
                worded.append(f"{key}:\n    old {a['refused']}\n    new {b['refused']}")
            elif isinstance(a, dict) or isinstance(b, dict):
                lines.append(f"{key}: old {a if isinstance(a, dict) else 'decoded'}, new "
                             f"{b if isinstance(b, dict) else 'decoded'}")
            else:
                rows = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
                fields = sorted({f for i in rows for f in a[i]["stats"] if a[i]["stats"][f] != b[i]["stats"][f]})
                tokens = any(a[i]["tokens"] != b[i]["tokens"] for i in rows)
                lines.append(f"{key}: rows {rows} differ (tokens: {tokens}; stats: {', '.join(fields) or 'none'})")
    return lines, worded


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rev", nargs="?", help="the git revision to compare this tree with (e.g. 0e51fc7)")
    parser.add_argument("--prompts", type=int, default=4, help="prompts decoded per case (1-7; default 4)")
    parser.add_argument("--max-new-tokens", type=int, default=16, help="tokens per prompt (default 16)")
    parser.add_argument("--worktree", type=Path, help="where to check REV out (default: a fresh temporary folder)")
    parser.add_argument("--refusals", action="store_true", help="also print the refusals worded differently")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--kinds", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        worker(args.worker, args.prompts, args.max_new_tokens, args.kinds.split(",") if args.kinds else None)
        return 0
    if args.rev is None:
        parser.error("give the git revision to compare with")
    worktree = args.worktree or Path(tempfile.mkdtemp(prefix="old-decoder-")) / "tree"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(worktree), args.rev], check=True,
                   capture_output=True)
    try:
        old = decode_in(worktree, args.prompts, args.max_new_tokens)
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)], check=True)
    kinds = old.pop("kinds")
    new = decode_in(ROOT, args.prompts, args.max_new_tokens, kinds)
    new.pop("kinds")
    differences, worded = compare(old, new)
    decoded = sum(not isinstance(v, dict) for v in old.values())
    print(f"{len(old)} cases at {args.rev} ({len(rules())} rules x {len(kinds)} kinds' specs x {len(MODES)} modes x "
          f"{len(DRAFTS)} draft kinds, sd with the plain one; "
          f"{decoded} decoded, {len(old) - decoded} refused), {len(new)} here: {len(differences)} differ in tokens, "
          f"stats or whether they are refused; {len(worded)} refused in other words")
    for line in differences + (worded if args.refusals else []):
        print("  " + line)
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
