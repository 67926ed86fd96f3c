"""``python -m model_build.feature_draft``: train a feature-conditioned (EAGLE-style) draft for a target."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ahconf.entry import quiet_library_output
from decode.artifacts.hub import NATIVE_BF16, ModelLoadError, load_causal_lm, load_tokenizer, resolve_dtype
from decode.drafts.feature_model import FIRST_LAYERS
from model_build.model_store import file_hashes

from .build import FeatureRecipe, PromptSource, build_data, build_feature_draft, encoded, shard_plan
from .losses import DISTRIBUTION_LOSSES
from .model import FeatureDraftShape
from .response_pack import PackError, pack_responses, record_path, unpack_responses
from .shards import ShardMismatchError, ShardTimes, read_sequences
from .training import FeatureTraining


def parser() -> argparse.ArgumentParser:
    """The command line (``--help``)."""
    parser = argparse.ArgumentParser(
        prog="python -m model_build.feature_draft",
        description="Train a feature-conditioned draft (EAGLE-style: it reads the target's hidden states) for a "
        "target, from the target's own responses: teacher shards (resumable) then Lightning training (resumable "
        "from its last checkpoint); writes a from_pretrained directory and feature_draft.json.",
    )
    parser.add_argument("--target", required=True, help="the target: a from_pretrained directory or a .gguf file")
    parser.add_argument("--out", type=Path, required=True, help="where the draft's directory is written")
    parser.add_argument("--data-dir", type=Path, default=None, help="teacher shards (default: <out>.data)")
    parser.add_argument("--work-dir", type=Path, default=None, help="checkpoints (default: <out>.work)")
    default, training, shape = FeatureRecipe(), FeatureTraining(), FeatureDraftShape()
    parser.add_argument("--shards", type=int, default=default.shards, help="teacher shards (of --prompts-per-shard)")
    parser.add_argument("--prompts-per-shard", type=int, default=default.prompts_per_shard)
    parser.add_argument("--response-tokens", type=int, default=default.response_tokens)
    parser.add_argument("--temperatures", type=float, nargs="+", default=list(default.temperatures), metavar="T",
                        help="one pass over the prompts per temperature, 0 for greedy (default: 1 0)")
    parser.add_argument("--generation-batch", type=int, default=default.generation_batch,
                        help="prompts the target answers at once")
    parser.add_argument("--stage", choices=("all", "responses", "teacher", "pack"), default="all",
                        help="responses: only generate the response shards (resumable); teacher: the response and "
                        "teacher shards, no training; pack: pack the response shards into --pack")
    parser.add_argument("--pack", type=Path, default=None,
                        help="a response pack (model_build.feature_draft.response_pack): written by --stage pack, "
                        "else unpacked into the data directory before anything is generated")
    parser.add_argument("--steps", type=int, default=training.steps)
    parser.add_argument("--tokens-per-step", type=int, default=training.tokens_per_step)
    parser.add_argument("--lr", type=float, default=training.lr)
    parser.add_argument("--checkpoint-every", type=int, default=training.checkpoint_every, metavar="STEPS",
                        help="steps between checkpoints (<work-dir>/checkpoints/last.ckpt: a killed run resumes there)")
    parser.add_argument("--held-out-sequences", type=int, default=training.held_out_sequences, metavar="N",
                        help="the last N sequences of the shards: never trained on, measured after training")
    parser.add_argument("--init-from", type=Path, default=None, metavar="DIR",
                        help="continue from a trained draft's directory (its shape and output subset; the record "
                        "keeps its sha256 and recipe)")
    parser.add_argument("--unroll", type=int, default=training.unroll,
                        help="depths trained per position (1: the target's features only)")
    parser.add_argument("--regression-weight", type=float, default=training.regression_weight)
    parser.add_argument("--loss", choices=sorted(DISTRIBUTION_LOSSES), default=training.loss,
                        help="the distribution loss (kl: soft cross-entropy; tv: 1 - alpha; neg_log_alpha: -log alpha; "
                        "lk: the LK hybrid)")
    parser.add_argument("--causal-unroll", action="store_true",
                        help="deeper depths attend causally over their own pass (v1) instead of decoding's masks")
    parser.add_argument("--unreachable-top-k", type=int, default=training.unreachable_top_k, metavar="K",
                        help="train a depth only where the round's earlier tokens were in the draft's top-K (0: off)")
    parser.add_argument("--on-policy-steps", type=int, default=training.on_policy_steps,
                        help="steps after --steps that train only where the draft is rejected")
    parser.add_argument("--layers", type=int, default=shape.layers, help="the draft's decoder layers")
    parser.add_argument("--feature-layers", type=int, nargs="+", default=None, metavar="N",
                        help="the target's hidden_states read (default: the last; EAGLE-3: e.g. 2 15 27)")
    parser.add_argument("--teacher-layers", type=int, nargs="+", default=None, metavar="N",
                        help="the target's hidden_states the teacher shards store (default: --feature-layers); "
                        "store more to train drafts reading different ones from the same shards")
    parser.add_argument("--head-rank", type=int, default=shape.head_rank,
                        help="a low-rank output layer of this rank (default: full)")
    parser.add_argument("--feature-norm", action="store_true", help="EAGLE-3.1's norms on the features read")
    parser.add_argument("--first-layer", choices=FIRST_LAYERS, default=shape.first_layer,
                        help="fc: this project's projection of the token and its feature into a Llama layer; eagle3: "
                        "EAGLE-3's first layer, as vLLM and speculators load it (python -m decode.artifacts.export_draft); "
                        "its default --feature-layers are EAGLE-3's low, middle and high layers")
    parser.add_argument("--vocab-subset", type=int, default=shape.vocab_subset,
                        help="tokens its output layer scores (0: the whole vocabulary)")
    parser.add_argument("--prompt-source", default=PromptSource().source, help="prompt source (data_gen.prompts)")
    parser.add_argument("--dtype", default=NATIVE_BF16,
                        help=f"the target's precision for generation and the teacher pass (default {NATIVE_BF16}: "
                        "bfloat16 where the machine computes it natively, else float32)")
    parser.add_argument("--seed", type=int, default=default.seed)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command; 0 when the draft was written, 2 on an unusable input."""
    args = parser().parse_args(argv)
    quiet_library_output()
    recipe = FeatureRecipe(
        shape=FeatureDraftShape(layers=args.layers, vocab_subset=args.vocab_subset or None,
                                feature_layers=tuple(args.feature_layers) if args.feature_layers else None,
                                head_rank=args.head_rank, feature_norm=args.feature_norm,
                                first_layer=args.first_layer),
        training=dataclasses.replace(FeatureTraining(), steps=args.steps, tokens_per_step=args.tokens_per_step,
                                     lr=args.lr, checkpoint_every=args.checkpoint_every,
                                     held_out_sequences=args.held_out_sequences, unroll=args.unroll,
                                     regression_weight=args.regression_weight,
                                     loss=args.loss, exact_masks=not args.causal_unroll,
                                     unreachable_top_k=args.unreachable_top_k, on_policy_steps=args.on_policy_steps,
                                     seed=args.seed),
        prompts=dataclasses.replace(PromptSource(), source=args.prompt_source),
        shards=args.shards, prompts_per_shard=args.prompts_per_shard, response_tokens=args.response_tokens,
        temperatures=tuple(args.temperatures), generation_batch=args.generation_batch, seed=args.seed,
        teacher_layers=tuple(args.teacher_layers) if args.teacher_layers else None,
    )
    out = args.out.expanduser()
    try:
        print(f"loading the target {args.target} ...", file=sys.stderr, flush=True)
        target = load_causal_lm(args.target, dtype=resolve_dtype(args.dtype))
        tokenizer = load_tokenizer(args.target)
        weights = file_hashes(Path(args.target), ["model.safetensors"]) if Path(args.target).is_dir() else {}
        target_sha256, data_dir = weights.get("model.safetensors", args.target), args.data_dir or out.with_name(
            out.name + ".data")
        if args.stage == "pack" or args.pack is not None:
            if args.pack is None:
                raise ValueError("--stage pack writes the file --pack names: add --pack PATH")
            pack_or_unpack(args.stage, args.pack.expanduser(), target, tokenizer, target_sha256, recipe, data_dir)
            if args.stage == "pack":
                return 0
        if args.stage in ("responses", "teacher"):
            times = ShardTimes()
            paths = build_data(target, tokenizer, target_sha256, recipe, data_dir, args.stage == "teacher", times)
            Console(width=120).print(shards_table(paths, times))
            return 0
        result = build_feature_draft(target, tokenizer, target_sha256, recipe, out, data_dir,
                                     args.work_dir or out.with_name(out.name + ".work"),
                                     args.init_from.expanduser() if args.init_from else None)
    except (ModelLoadError, ShardMismatchError, PackError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    Console(width=120).print(summary_table(result.record, out))
    return 0


def pack_or_unpack(stage: str, pack: Path, target: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                   target_sha256: str, recipe: FeatureRecipe, data_dir: Path) -> None:
    """``--stage pack``: the data directory's response shards into ``pack``; else ``pack`` into the directory."""
    plan = shard_plan(recipe, target, target_sha256)
    if stage == "pack":
        record = pack_responses(data_dir, plan, recipe.shards, pack)
        print(f"packed {record['sequences']:,} responses ({record['response_tokens']:,} tokens) of {record['shards']} "
              f"shards into {pack} ({pack.stat().st_size / 2 ** 20:.1f} MiB, sha256 in {record_path(pack).name})")
        return
    paths = unpack_responses(pack, plan, encoded(tokenizer, recipe.prompts, recipe.seed), data_dir)
    print(f"unpacked {len(paths)} response shards from {pack} into {data_dir}", file=sys.stderr)


def shards_table(paths: list[Path], times: ShardTimes) -> Table:
    """The shards: sequences and response tokens in all, and what this run made at what rate."""
    table = Table(title=f"shards in {paths[0].parent}" if paths else "no shards",
                  caption="shards made earlier are read, not timed")
    for column in ("shards", "sequences", "response tokens", "made by this run", "seconds", "per second"):
        table.add_column(column, justify="right")
    sequences = [read_sequences(path) for path in paths]
    spent = times.to_dict()
    table.add_row(str(len(paths)), f"{sum(len(s.lengths) for s in sequences):,}",
                  f"{sum(int((s.lengths - s.prompt_lengths).sum()) for s in sequences):,}",
                  f"{times.response_tokens:,} response tokens", f"{times.response_seconds:.0f}",
                  f"{spent['response_tokens_per_second']:.0f}")
    if times.teacher_positions:
        table.add_row("", "", "", f"{times.teacher_positions:,} teacher positions", f"{times.teacher_seconds:.0f}",
                      f"{spent['teacher_positions_per_second']:.0f}")
    return table


def summary_table(record: dict, out: Path) -> Table:
    """Data, training and held-out figures per depth."""
    data, training, spent = record["data"], record["training"], record["time"]
    table = Table(title=f"feature draft written to {out}",
                  caption=f"{data['response_tokens']:,} target-response tokens and {data['positions']:,} positions in "
                  f"{data['shards']} shards; {training['steps']} steps; {record['build_seconds']:.0f} s in all: "
                  f"{spent['response_seconds']:.0f} s generating ({spent['response_tokens_per_second']:.0f} response "
                  f"tokens/s), {spent['teacher_seconds']:.0f} s teacher pass "
                  f"({spent['teacher_positions_per_second']:.0f} positions/s), {spent['training_seconds']:.0f} s "
                  "training (shards made earlier are read, not timed); overlap: Σ min(p, q) over the target's top-k, a "
                  "lower bound of 1 − TV; unconditional: its product along each round")
    for column in ("held out at depth", "soft cross-entropy", "argmax agreement", "overlap", "unconditional"):
        table.add_column(column, justify="right")
    for depth, figures in enumerate(training["held_out"], 1):
        table.add_row(str(depth), f"{figures['cross_entropy']:.3f}", f"{figures['agreement']:.3f}",
                      f"{figures['overlap']:.3f}", f"{figures['reached']:.3f}")
    return table


if __name__ == "__main__":
    sys.exit(main())
