"""``python -m model_build.feature_draft.ablation``: each lever of the training recipe on and off, from the same teacher
shards, at the same steps (``docs/real.md``, "Training recipe v2: the ablation").

Every arm starts from the same target and subset, trains for the same steps on the same batches, and is measured on
the same held-out sequences (the last ones of the shards) at depths ``1 .. 8`` with decoding's masks: ``α`` over
the target's top-k (a lower bound of ``1 − TV``), conditional and unconditional
(:func:`model_build.feature_draft.training.held_out_losses`), greedy agreement, the expected accepted length of a
fixed K (``1 + Σ_{j≤K}`` unconditional), its step cost (one single-token forward at batch 1 on a cached context
as a share of the target's, the two taking turns) and its training time. An arm's result is written whole when it
finishes; a run started again skips finished arms and resumes an unfinished one from its last checkpoint.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from ahconf.entry import quiet_library_output
from decode.artifacts.hub import NATIVE_BF16, ModelLoadError, load_causal_lm, native_bf16, resolve_dtype
from model_build.model_store import file_hashes
from runtime.install import write_json

from .model import FeatureDraftShape, frequent_tokens, initial_draft
from .realism import step_costs
from .shards import TEACHER, read_sequences
from .training import FeatureTraining, TeacherData, held_out_losses, split_held_out, train_feature_draft

EVAL_DEPTHS = 8
ACCEPTED_K = tuple(range(2, EVAL_DEPTHS + 1))


@dataclass(frozen=True)
class Arm:
    """One recipe: the base with some shape and training fields changed."""

    name: str
    shape: dict = field(default_factory=dict)
    training: dict = field(default_factory=dict)


def arms(steps: int, fused: tuple[int, ...]) -> list[Arm]:
    """The base recipe and one lever changed at a time."""
    return [
        Arm("base (v2 defaults)"),
        Arm("causal unroll (v1)", training={"exact_masks": False}),
        Arm("unroll 2", training={"unroll": 2}),
        Arm("loss tv", training={"loss": "tv"}),
        Arm("loss -log alpha", training={"loss": "neg_log_alpha"}),
        Arm("loss lk", training={"loss": "lk"}),
        Arm("feature norm", shape={"feature_norm": True}),
        Arm(f"fused layers {' '.join(map(str, fused))}", shape={"feature_layers": fused, "feature_norm": True},
            training={"regression_weight": 0.0}),
        Arm("unreachable top-4", training={"unreachable_top_k": 4}),
        Arm("on-policy +25 %", training={"on_policy_steps": max(1, steps // 4)}),
        Arm("head rank 128", shape={"head_rank": 128}),
        Arm("subset 4096", shape={"vocab_subset": 4096}),
    ]


def arm_dir(root: Path, arm: Arm) -> Path:
    """Where an arm's checkpoints and result live."""
    return root / "".join(c if c.isalnum() else "-" for c in arm.name.lower()).strip("-")


def run_arm(target: torch.nn.Module, paths: list[Path], base_shape: FeatureDraftShape, base: FeatureTraining,
            arm: Arm, root: Path, precision: str, subsets: dict[int, torch.Tensor], context: list[int],
            repeats: int) -> dict:
    """Train and measure one arm, or read its finished result."""
    directory = arm_dir(root, arm)
    result_file = directory / "result.json"
    if result_file.is_file():
        return json.loads(result_file.read_text())
    shape = dataclasses.replace(base_shape, **arm.shape)
    training = dataclasses.replace(base, **arm.training)
    draft = initial_draft(target, shape, subsets.get(shape.vocab_subset) if shape.vocab_subset else None)
    started = time.perf_counter()
    train_feature_draft(draft, paths, training, directory, precision=precision)
    seconds = time.perf_counter() - started
    data = TeacherData(paths, training.max_length, draft.feature_layers)
    _, held = split_held_out(data, training.held_out_sequences)
    figures = held_out_losses(draft, data, held, training, depths=EVAL_DEPTHS)
    del data
    timed = draft.to(target.dtype).eval()
    cost = step_costs({"target": target, "feature_draft": timed}, context, repeats).feature_draft
    reached = [one["reached"] for one in figures]
    result = {"arm": arm.name, "shape": dataclasses.asdict(shape), "training": dataclasses.asdict(training),
              "held_out": figures, "cost": cost, "train_seconds": round(seconds, 1),
              "accepted_length": {str(k): 1 + sum(reached[:k]) for k in ACCEPTED_K}}
    write_json(result_file, result)
    return result


def ablation_table(results: list[dict], depths: int = 6) -> Table:
    """One row per arm: α by depth (conditional, then unconditional), accepted length by K, cost, training time."""
    table = Table(title="feature-draft recipe ablation (held-out sequences, decoding's masks)",
                  caption="alpha = Σ_k min(p, q) over the target's top-k (a lower bound of 1 - TV), T = 1 labels; "
                  "cond.: given the earlier depths accepted; uncond.: all of depths 1..d; E(len) at K: "
                  "1 + Σ_j≤K uncond._j; cost: draft step / target step, batch 1")
    for column in ("arm", "figure", *(f"d{d}" for d in range(1, depths + 1)), "agree d1",
                   *(f"E(len) K={k}" for k in (2, 4, 6, 8)), "cost", "train s"):
        table.add_column(column, justify="left" if column in ("arm", "figure") else "right")
    for result in results:
        held = result["held_out"]
        for index, key in enumerate(("conditional", "reached")):
            tail = ([f"{held[0]['agreement']:.3f}", *(f"{result['accepted_length'][str(k)]:.2f}" for k in (2, 4, 6, 8)),
                     f"{result['cost']:.3f}", f"{result['train_seconds']:.0f}"] if index == 0 else [""] * 7)
            table.add_row(result["arm"] if index == 0 else "", "cond." if index == 0 else "uncond.",
                          *(f"{one[key]:.3f}" for one in held[:depths]), *tail)
    return table


def parser() -> argparse.ArgumentParser:
    """The command line (``--help``)."""
    parser = argparse.ArgumentParser(
        prog="python -m model_build.feature_draft.ablation",
        description="Train one feature draft per lever of the recipe (each changed alone from the base) on the same "
        "teacher shards and print the ablation table; finished arms are kept, an interrupted one resumes.")
    parser.add_argument("--target", required=True, help="the target: a from_pretrained directory or a .gguf file")
    parser.add_argument("--data-dir", type=Path, required=True,
                        help="teacher shards (python -m model_build.feature_draft; they must store every layer an arm "
                        "reads: --teacher-layers)")
    parser.add_argument("--shards", type=int, required=True, help="teacher shards used (the first N)")
    parser.add_argument("--out", type=Path, required=True, help="the arms' checkpoints and results")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--tokens-per-step", type=int, default=4096)
    parser.add_argument("--arms", nargs="+", default=None, metavar="NAME", help="only these arms (default: all)")
    parser.add_argument("--fused-layers", type=int, nargs="+", default=[2, 15, 27])
    parser.add_argument("--vocab-subset", type=int, default=FeatureDraftShape().vocab_subset,
                        help="tokens the base recipe's output layer scores")
    parser.add_argument("--held-out-sequences", type=int, default=FeatureTraining().held_out_sequences,
                        help="the last sequences of the shards, never trained on, that every arm is measured on")
    parser.add_argument("--repeats", type=int, default=30, help="timed rounds of each step cost")
    parser.add_argument("--dtype", default=NATIVE_BF16)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the arms; 0 when every arm has a result, 2 on an unusable input."""
    args = parser().parse_args(argv)
    quiet_library_output()
    paths = [args.data_dir / f"{TEACHER}-{index:05d}.safetensors" for index in range(args.shards)]
    missing = [path.name for path in paths if not path.is_file()]
    if missing:
        print(f"error: {args.data_dir} lacks {missing[0]} (and {len(missing) - 1} more); make the teacher shards "
              "first (python -m model_build.feature_draft --stage all, or --steps 0)", file=sys.stderr)
        return 2
    try:
        target = load_causal_lm(args.target, dtype=resolve_dtype(args.dtype))
    except ModelLoadError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    base = dataclasses.replace(FeatureTraining(), steps=args.steps, tokens_per_step=args.tokens_per_step,
                               checkpoint_every=max(1, args.steps // 4), held_out_sequences=args.held_out_sequences)
    base_shape = FeatureDraftShape(vocab_subset=args.vocab_subset)
    chosen = [arm for arm in arms(args.steps, tuple(args.fused_layers)) if args.arms is None or arm.name in args.arms]
    stored = [read_sequences(path) for path in paths]
    subsets = {size: frequent_tokens((s.tokens for s in stored), target.config.vocab_size, size)
               for size in {base_shape.vocab_subset, *(arm.shape.get("vocab_subset") for arm in chosen)}
               if size}
    context = stored[0].split()[0][0] + stored[0].split()[0][1]
    del stored
    precision = "bf16-mixed" if native_bf16("cuda" if torch.cuda.is_available() else "cpu") else "32-true"
    results = []
    try:
        for arm in chosen:
            print(f"arm {arm.name} ...", file=sys.stderr, flush=True)
            results.append(run_arm(target, paths, base_shape, base, arm, args.out, precision, subsets, context,
                                   args.repeats))
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    target_files = file_hashes(Path(args.target), ["model.safetensors"]) if Path(args.target).is_dir() else {}
    write_json(args.out / "ablation.json", {"arms": results, "target_files": target_files})
    Console(width=160).print(ablation_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
