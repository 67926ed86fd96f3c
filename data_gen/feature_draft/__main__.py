"""``python -m data_gen.feature_draft``: train a feature-conditioned (EAGLE-style) draft for a target."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ahconf.entry import quiet_library_output
from data_gen.model_store import file_hashes
from decode.artifacts.hub import NATIVE_BF16, ModelLoadError, load_causal_lm, load_tokenizer, resolve_dtype

from .build import FeatureRecipe, PromptSource, build_feature_draft
from .model import FeatureDraftShape
from .shards import ShardMismatchError
from .training import FeatureTraining


def parser() -> argparse.ArgumentParser:
    """The command line (``--help``)."""
    parser = argparse.ArgumentParser(
        prog="python -m data_gen.feature_draft",
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
    parser.add_argument("--steps", type=int, default=training.steps)
    parser.add_argument("--tokens-per-step", type=int, default=training.tokens_per_step)
    parser.add_argument("--lr", type=float, default=training.lr)
    parser.add_argument("--unroll", type=int, default=training.unroll,
                        help="depths trained per position (1: the target's features only)")
    parser.add_argument("--regression-weight", type=float, default=training.regression_weight)
    parser.add_argument("--layers", type=int, default=shape.layers, help="the draft's decoder layers")
    parser.add_argument("--feature-layers", type=int, nargs="+", default=None, metavar="N",
                        help="the target's hidden_states read (default: the last; EAGLE-3: e.g. 2 15 30)")
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
                                feature_layers=tuple(args.feature_layers) if args.feature_layers else None),
        training=dataclasses.replace(FeatureTraining(), steps=args.steps, tokens_per_step=args.tokens_per_step,
                                     lr=args.lr, unroll=args.unroll, regression_weight=args.regression_weight,
                                     seed=args.seed),
        prompts=dataclasses.replace(PromptSource(), source=args.prompt_source),
        shards=args.shards, prompts_per_shard=args.prompts_per_shard, response_tokens=args.response_tokens,
        seed=args.seed,
    )
    out = args.out.expanduser()
    try:
        print(f"loading the target {args.target} ...", file=sys.stderr, flush=True)
        target = load_causal_lm(args.target, dtype=resolve_dtype(args.dtype))
        tokenizer = load_tokenizer(args.target)
        weights = file_hashes(Path(args.target), ["model.safetensors"]) if Path(args.target).is_dir() else {}
        result = build_feature_draft(target, tokenizer, weights.get("model.safetensors", args.target), recipe, out,
                                     args.data_dir or out.with_name(out.name + ".data"),
                                     args.work_dir or out.with_name(out.name + ".work"))
    except (ModelLoadError, ShardMismatchError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    Console(width=120).print(summary_table(result.record, out))
    return 0


def summary_table(record: dict, out: Path) -> Table:
    """Data, training and held-out figures per depth."""
    data, training = record["data"], record["training"]
    table = Table(title=f"feature draft written to {out}",
                  caption=f"{data['response_tokens']:,} target-response tokens and {data['positions']:,} positions in "
                  f"{data['shards']} shards; {training['steps']} steps in {record['build_seconds']:.0f} s; "
                  "overlap: Σ min(p, q) over the target's top-k, a lower bound of 1 − TV")
    for column in ("held out at depth", "soft cross-entropy", "argmax agreement", "overlap"):
        table.add_column(column, justify="right")
    for depth, figures in enumerate(training["held_out"], 1):
        table.add_row(str(depth), f"{figures['cross_entropy']:.3f}", f"{figures['agreement']:.3f}",
                      f"{figures['overlap']:.3f}")
    return table


if __name__ == "__main__":
    sys.exit(main())
