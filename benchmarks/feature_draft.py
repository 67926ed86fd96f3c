"""Wall clock at batch 1 of a real pair's feature draft against its draft and the target alone.

    python -m benchmarks.feature_draft [--pair smollm2] [--prompts 16] [--max-new-tokens 96]
                                      [--ks 1 2 3 4] [--taus 0.3 0.5 0.7] [--threads N]

Every method decodes the same chat-rendered prompts (T = 1, the pair's precision) with the same per-prompt
seeds, the methods taking turns on each prompt. The draft's and the feature draft's fixed K and the feature
draft's confidence threshold ``τ`` (an adaptive policy: stop after a candidate whose top probability is below
``τ``) are chosen on the dev prompts; the chosen ones are reported on the test prompts and on HumanEval, each
with a 95 % paired-bootstrap interval over prompts of its speed-up over the target alone.
"""

from __future__ import annotations

import argparse

from rich.console import Console
from transformers import PreTrainedModel

from ahconf.entry import quiet_library_output
from benchmarks.real_pair import load_real_pair
from benchmarks.turns import Decode, Timed, hf_target_alone, table, time_methods
from decode.loops.speculative_decoder import SpeculativeDecoder
from decode.policies.base import Policy
from decode.policies.schedules import Confidence, Fixed
from decode.sampling import Sampling
from decode.threads import torch_threads
from model_build.real.build import encoded_prompts
from model_build.real.feature import ROLE


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.feature_draft", description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", default="smollm2", help="the real pair (default smollm2)")
    parser.add_argument("--prompts", type=int, default=16, help="prompts per set (default 16)")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 2, 3, 4], help="fixed K chosen from on dev")
    parser.add_argument("--taus", type=float, nargs="+", default=[0.3, 0.5, 0.7], help="τ chosen from on dev")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def decoder_run(target: PreTrainedModel, draft: PreTrainedModel | None, policy: Policy | None, budget: int) -> Decode:
    """Decode with ``draft`` under ``policy``; without a draft, the target alone (its own ``generate``)."""
    if draft is None:
        return hf_target_alone(target, budget)
    decoder = SpeculativeDecoder(target, draft, policy=policy, sampling=Sampling(), eos_token_id=None)
    return lambda prompt, seed: decoder.generate(prompt, max_new_tokens=budget, seed=seed).stats.generated


def main(argv: list[str] | None = None) -> dict[str, list[Timed]]:
    args = parse_args(argv)
    quiet_library_output()
    torch_threads(args.threads or None)
    real = load_real_pair(args.pair, ("target", "draft", ROLE))
    spec, models, tokenizer, dtype = real.spec, real.models, real.tokenizer, real.dtype
    sets = {name: encoded_prompts(spec, tokenizer, source, split, args.prompts, args.seed, style=style)
            for name, (source, split, style) in {"dev": ("builtin", "dev", "function"),
                                                 "test": ("builtin", "test", "function"),
                                                 "HumanEval": ("humaneval", "test", None)}.items()}
    target, budget = models["target"], args.max_new_tokens
    console = Console(width=120)
    dev_methods = {"target alone": decoder_run(target, None, None, budget)}
    for k in args.ks:
        dev_methods[f"draft Fixed({k})"] = decoder_run(target, models["draft"], Fixed(k), budget)
        dev_methods[f"feature draft Fixed({k})"] = decoder_run(target, models[ROLE], Fixed(k), budget)
    for tau in args.taus:
        dev_methods[f"feature draft Confidence({tau})"] = decoder_run(target, models[ROLE], Confidence(tau, 8),
                                                                      budget)
    results = {"dev": time_methods(dev_methods, sets["dev"], "dev (selection)")}
    console.print(table(f"dev: {len(sets['dev'])} prompts x {budget} tokens, {dtype}", results["dev"], args.seed))
    by_name = {one.name: one for one in results["dev"]}

    def best(prefix: str) -> str:
        return max((name for name in by_name if name.startswith(prefix)), key=lambda name: by_name[name].rate)

    chosen = ["target alone", best("draft Fixed"), best("feature draft Fixed"), best("feature draft Confidence")]
    for name in ("test", "HumanEval"):
        results[name] = time_methods({method: dev_methods[method] for method in chosen}, sets[name], name)
        console.print(table(f"{name}: {len(sets[name])} prompts x {budget} tokens, {dtype}; K and τ chosen on dev",
                            results[name], args.seed))
    return results


if __name__ == "__main__":
    main()
