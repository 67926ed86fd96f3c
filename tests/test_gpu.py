"""The whole pipeline on CUDA (marker ``gpu``; skipped where there is no CUDA device).

Run on a GPU machine with ``make test PYTEST_ARGS="-m gpu"``: collect → train (``trainer=gpu``,
bf16-mixed) → export → ``load_head`` → decode with every rule (and the ensemble decoder) →
evaluate, on the micro models; plus the exact-distribution checks of both decoders on CUDA, and compiled decoding
(``compile=True``: CUDA graphs) against eager decoding.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch._dynamo.utils

from accept_heads.evaluate import evaluate
from accept_heads.train import train
from data_gen.collect import collect
from data_gen.shards import load_split
from decode import EnsembleDecoder, EnsembleFn, Sampling, SpeculativeDecoder, policies, rules
from decode.artifacts.hub import load_causal_lm, load_tokenizer
from decode.artifacts.serialization import load_head
from tests.helpers.config import DATA_OVERRIDES, TRAIN_OVERRIDES, compose_config, model_overrides
from tests.helpers.micro_models import micro_lm

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

SAMPLES = 4000  # decodes per exact-distribution check
DECODE_RULES = (
    rules.Speculative(),
    rules.Greedy(),
    rules.Fuzzy("js", 0.3),
    rules.Ensemble("weighted", weight=0.5),
    rules.Ensemble("contrastive", mu=0.1),
)


@pytest.fixture(scope="module")
def cuda_pipeline(micro_trio: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Collected micro data and a head trained with ``trainer=gpu`` (bf16-mixed), all on CUDA."""
    root = tmp_path_factory.mktemp("gpu")
    overrides = [*model_overrides(micro_trio), *DATA_OVERRIDES, *TRAIN_OVERRIDES, f"paths.root={root}",
                 "trainer=gpu", "trainer.num_workers=0"]
    manifest = collect(compose_config(*overrides).collect_job())
    result = train(compose_config(*overrides).train_job())
    return {"overrides": overrides, "manifest": manifest, "result": result, "root": root}


def test_collect_and_train_run_on_cuda(cuda_pipeline: dict) -> None:
    config = compose_config(*cuda_pipeline["overrides"])
    train_rows = load_split(Path(config.paths.data_dir), "train")
    assert len(train_rows) == 8 and all(len(r) > 0 for r in train_rows["response_ids"])
    result = cuda_pipeline["result"]
    assert Path(result.head_path).is_file()
    assert result.dev_metrics["val/binary_kl_constant"] > 0


def test_exported_head_decodes_every_rule_on_cuda(cuda_pipeline: dict, micro_trio: dict[str, Path]) -> None:
    device = torch.device("cuda")
    target = load_causal_lm(str(micro_trio["target"]), dtype="float32").to(device)
    draft = load_causal_lm(str(micro_trio["draft"]), dtype="float32").to(device)
    tokenizer = load_tokenizer(str(micro_trio["draft"]))
    head = load_head(cuda_pipeline["result"].head_path, draft=draft, tokenizer=tokenizer)
    prompt = torch.tensor([tokenizer.encode("def main():\n    ")], device=device)
    for rule in DECODE_RULES:  # the head was trained for the speculative rule: the decoder refuses it elsewhere
        head_policy = [policies.Head(head, threshold=0.5, k_max=4)] if rule == rules.Speculative() else []
        for policy in (policies.Fixed(3), *head_policy):
            decoder = SpeculativeDecoder(target, draft, rule=rule, policy=policy, sampling=Sampling(), eos_token_id=None)
            first = decoder.generate(prompt, max_new_tokens=12, seed=3)
            again = decoder.generate(prompt, max_new_tokens=12, seed=3)
            assert first.sequences.device.type == "cuda" and first.stats.generated == 12
            assert torch.equal(first.sequences, again.sequences), f"{rule!r} / {policy!r} is not seeded"
    greedy = SpeculativeDecoder(target, draft, rule=rules.Greedy(), policy=policies.Fixed(4), eos_token_id=None)
    reference = target.generate(prompt, max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(greedy.generate(prompt, max_new_tokens=12).sequences, reference)
    for mode in ("sd", "alternate"):
        ensemble = EnsembleDecoder([draft, target], ensemble=EnsembleFn("weighted", weights=[0.5, 0.5]), mode=mode,
                                   proposal_lengths=[3, 1], sampling=Sampling(), eos_token_id=None)
        out = ensemble.generate(prompt, max_new_tokens=12, seed=5)
        assert out.sequences.device.type == "cuda" and out.sequences.shape[1] == prompt.shape[1] + 12


def test_evaluate_runs_on_cuda(cuda_pipeline: dict) -> None:
    out_dir = cuda_pipeline["root"] / "eval"
    config = compose_config(
        *cuda_pipeline["overrides"], f"evaluate.out_dir={out_dir}", "decoding.prompts={dev: 2, test: 2, ood: 2}",
        "decoding.max_new_tokens=8", "+evaluate.grids.fixed=[1,3]", "+evaluate.grids.confidence=[0.4]",
        "evaluate.rule_grids.fuzzy=[0.3]", "evaluate.hf.baselines=false",
    )
    results = evaluate(config.evaluate_job())
    assert (out_dir / "results.parquet").is_file()
    assert results.metadata.device.startswith("cuda")


@pytest.mark.parametrize("rule", [rules.Speculative(), rules.Ensemble("weighted", weight=0.5)], ids=repr)
def test_speculative_decoder_samples_the_exact_distribution_on_cuda(rule: rules.Rule) -> None:
    """Empirical next-two-token distribution vs the exact one (V = 4, enumeration), on the GPU."""
    device = torch.device("cuda")
    target, draft = micro_lm(4, seed=11, init=0.3).to(device), micro_lm(4, seed=12, init=0.3).to(device)
    prompt = torch.tensor([[0, 1]], device=device)
    exact = _exact_two_token(target, draft, rule, prompt)
    decoder = SpeculativeDecoder(target, draft, rule=rule, policy=policies.Fixed(2), eos_token_id=None)
    empirical = _empirical(decoder, prompt)
    assert _tv(empirical, exact) < _tv_bound(exact, SAMPLES)
    wrong = _exact_two_token(target, draft, rules.Speculative() if rule.name == "ensemble" else
                             rules.Ensemble("weighted", weight=0.9), prompt)
    assert _tv(empirical, wrong) > _tv_bound(wrong, SAMPLES), "negative control: the check can fail"


@pytest.mark.parametrize("policy", [policies.Fixed(3), policies.Confidence(tau=0.5)], ids=repr)
def test_compiled_decoding_replays_cuda_graphs_and_decodes_as_eager(policy: policies.Policy) -> None:
    """Greedy, float32: compiled decoding (CUDA graphs recorded, then replayed) gives eager decoding's tokens and
    calls; no graph is left out of CUDA graphs."""
    device = torch.device("cuda")
    target = micro_lm(96, seed=21, hidden=32, layers=2, init=0.3).to(device)
    draft = micro_lm(96, seed=22, hidden=16, init=0.3).to(device)
    eager, fast = (SpeculativeDecoder(target, draft, rule=rules.Greedy(), policy=policy, eos_token_id=None,
                                      compile=compile) for compile in (False, True))
    skips = torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]
    for repeat in range(3):  # a shape's first call warms up, its second records, later ones replay
        for prompt in ([3, 1, 4], [1, 5, 9, 2, 6, 5, 3], list(range(40, 70))):
            ids = torch.tensor([prompt], device=device)
            expected, got = eager.generate(ids, 24), fast.generate(ids, 24)
            assert torch.equal(got.sequences, expected.sequences), f"repeat {repeat}, prompt of {len(prompt)}"
            assert got.stats.target_calls == expected.stats.target_calls
    assert fast.compiled_models()["target"].log.graphs >= 1 and fast.compiled_models()["draft"].log.graphs >= 1
    assert torch._dynamo.utils.counters["inductor"]["cudagraph_skips"] == skips


def test_compiled_decoding_samples_the_exact_distribution_on_cuda() -> None:
    device = torch.device("cuda")
    target, draft = micro_lm(4, seed=11, init=0.3).to(device), micro_lm(4, seed=12, init=0.3).to(device)
    prompt = torch.tensor([[0, 1]], device=device)
    rule = rules.Speculative()
    exact = _exact_two_token(target, draft, rule, prompt)
    decoder = SpeculativeDecoder(target, draft, rule=rule, policy=policies.Fixed(2), eos_token_id=None, compile=True)
    empirical = _empirical(decoder, prompt)
    assert _tv(empirical, exact) < _tv_bound(exact, SAMPLES)
    assert decoder.compiled_models()["target"].log.graphs >= 1


def test_ensemble_decoder_samples_the_exact_distribution_on_cuda() -> None:
    device = torch.device("cuda")
    target, draft = micro_lm(4, seed=11, init=0.3).to(device), micro_lm(4, seed=12, init=0.3).to(device)
    prompt = torch.tensor([[0, 1]], device=device)
    rule = rules.Ensemble("weighted", weight=0.5)
    exact = _exact_two_token(target, draft, rule, prompt)
    decoder = EnsembleDecoder([draft, target], ensemble=EnsembleFn("weighted", weights=[0.5, 0.5]), mode="alternate",
                              proposal_lengths=[2, 1], eos_token_id=None)
    empirical = _empirical(decoder, prompt)
    assert _tv(empirical, exact) < _tv_bound(exact, SAMPLES)


def _empirical(decoder: SpeculativeDecoder | EnsembleDecoder, prompt: torch.Tensor) -> torch.Tensor:
    """Frequencies of the 16 two-token continuations over ``SAMPLES`` seeds."""
    counts = torch.zeros(16, dtype=torch.float64)
    for seed in range(SAMPLES):
        tail = decoder.generate(prompt, max_new_tokens=2, seed=seed).sequences[0, 2:].tolist()
        counts[tail[0] * 4 + tail[1]] += 1
    return counts / SAMPLES


def _exact_two_token(target: torch.nn.Module, draft: torch.nn.Module, rule: rules.Rule, prompt: torch.Tensor) -> torch.Tensor:
    """Exact probability of each of the 16 two-token continuations under the rule's verifier distribution."""
    conts = torch.tensor([[a, b] for a in range(4) for b in range(4)], device=prompt.device)
    ids = torch.cat([prompt.expand(16, -1), conts], dim=1)
    with torch.no_grad():
        p = target(ids).logits[:, 1:3].double()
        q = draft(ids).logits[:, 1:3].double()
    v = rule.verifier_probs(p, q, Sampling()).double()
    return v.gather(-1, conts.unsqueeze(-1)).squeeze(-1).prod(-1).cpu()


def _tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(0.5 * (a - b).abs().sum())


def _tv_bound(probs: torch.Tensor, samples: int, draws: int = 200) -> float:
    """``mean + 5 sd`` of the TV of honest multinomial samples of the same size (fixed seed)."""
    generator = torch.Generator().manual_seed(0)
    tvs = torch.tensor([
        _tv(torch.multinomial(probs.float(), samples, replacement=True, generator=generator)
            .bincount(minlength=probs.numel()).double() / samples, probs)
        for _ in range(draws)
    ])
    return float(tvs.mean() + 5 * tvs.std())
