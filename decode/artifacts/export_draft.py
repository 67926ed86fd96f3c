"""``python -m decode.artifacts.export_draft DRAFT --target TARGET --out DIR``: a trained feature draft (EAGLE-3's first layer) as
a speculators checkpoint, which vLLM serves with ``speculative_config={"method": "eagle3", "model": DIR, ...}``.

The draft is checked against its target first (the layers it reads, their width, the vocabulary), written whole or
not at all, then read back into this project's draft class and compared with the draft on the target's own
features (:mod:`decode.artifacts.speculators`; ``docs/library.md``, "Serving a trained draft with vLLM").
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import transformers

from decode.artifacts.gguf import file_sha256
from decode.artifacts.hub import ModelLoadError, load_causal_lm, quiet_hub_logs
from decode.artifacts.speculators import FORMAT, SpeculatorsError, export_speculators, load_speculators
from decode.drafts.feature_model import FeatureDraftForCausalLM, feature_reads, target_features

CHECK_TOKENS = 64  # positions of the round-trip check


def parser() -> argparse.ArgumentParser:
    """The command line (``--help``)."""
    parser = argparse.ArgumentParser(prog="python -m decode.artifacts.export_draft", description=__doc__.split("\n\n")[0])
    parser.add_argument("draft", help="the feature draft: a from_pretrained directory")
    parser.add_argument("--target", required=True, help="its target: a from_pretrained directory or a .gguf file")
    parser.add_argument("--out", type=Path, required=True, help="the checkpoint's directory (replaced whole)")
    parser.add_argument("--format", choices=(FORMAT,), default=FORMAT, help="the checkpoint format (speculators)")
    parser.add_argument("-k", "--k", type=int, default=3, help="draft tokens a round, the checkpoint's default (3)")
    parser.add_argument("--verifier", default=None,
                        help="the target's name recorded in the checkpoint (default: the --target given)")
    return parser


@torch.no_grad()
def round_trip_difference(draft: FeatureDraftForCausalLM, target: torch.nn.Module, out: Path, seed: int = 0) -> float:
    """The largest logit difference (over the draft's subset) between ``draft`` and the checkpoint at ``out`` read
    back, both in float32, on random tokens with the target's features."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, draft.config.vocab_size, (1, CHECK_TOKENS), generator=generator)
    target, draft = target.float(), draft.float()
    back = load_speculators(out, target, dtype=torch.float32)
    hidden = target(input_ids=ids, output_hidden_states=True).hidden_states
    reads = feature_reads(draft.fuse_features(target_features(hidden, draft.feature_layers)),
                          torch.ones_like(ids))
    subset = draft.lm_head.token_ids
    ours = draft(input_ids=ids, features=reads).logits[0, 1:, subset]
    theirs = back(input_ids=ids, features=reads).logits[0, 1:, subset]
    return float((ours - theirs).abs().max())


def main(argv: list[str] | None = None) -> int:
    """Export; 0 when the checkpoint was written and reads back, 2 on an unusable draft or target."""
    args = parser().parse_args(argv)
    quiet_hub_logs()
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    try:
        print(f"loading the draft {args.draft} and the target {args.target} ...", file=sys.stderr, flush=True)
        draft = load_causal_lm(args.draft)
        target = load_causal_lm(args.target)
        weights = Path(args.draft) / "model.safetensors"
        record = {"source": {"draft": str(args.draft),
                             **({"model_sha256": file_sha256(weights)} if weights.is_file() else {})}}
        out = export_speculators(draft, args.out.expanduser(), target=target, k=args.k,
                                 verifier=args.verifier or str(args.target), record=record)
        difference = round_trip_difference(draft, target, out)
    except (ModelLoadError, SpeculatorsError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    config = draft.config
    print(f"wrote {out} ({FORMAT}, eagle3): reads the target's layers {list(config.feature_layers)}, scores "
          f"{config.draft_vocab_size} of {config.vocab_size} tokens (d2t), {config.num_hidden_layers} layer(s), "
          f"K = {args.k}; model.safetensors sha256 {file_sha256(out / 'model.safetensors')[:16]}… (in its config)")
    print(f"read back into FeatureDraftForCausalLM: largest logit difference {difference:.2e} over {CHECK_TOKENS - 1} "
          "positions (float32)")
    print(f'serve it: LLM(model=TARGET, speculative_config={{"method": "eagle3", "model": "{out}", '
          f'"num_speculative_tokens": {args.k}}})')
    return 0


if __name__ == "__main__":
    sys.exit(main())
