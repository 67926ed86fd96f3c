"""The exact-distribution checker (DESIGN §1, §6): the exact distribution of every continuation of a short prompt,
enumerated over all V**LENGTH of them with the models themselves, an empirical one from seeded decodes, and the TV
bound an honest sample of the same size stays under; the rules and length policies it is applied to."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import torch
from torch import Tensor
from transformers import PreTrainedModel

from decode import EnsembleDecoder, HeadConfig, Sampling, SpeculativeDecoder, SVProfile, policies, rules
from decode.costs import CostModel
from decode.head import PRE_FEATURES, AcceptanceHead
from decode.head_config import PREVIOUS_TOKEN, REQUEST_FEATURE, ROUND_FEATURE, TOP_K_FEATURES
from decode.policies.schedules import SVIP, RefitConfidence
from decode.policies.sources import (
    DraftConfidence,
    EntropyBound,
    MarginLogistic,
    OnlineHead,
    OnlineMargin,
    VLLMEstimator,
    VLLMLogistic,
)
from decode.policies.stops import Goodput, Threshold

PROMPT = torch.tensor([[0, 1]])
LENGTH = 3
N_DEFAULT = 1000
N_SLOW = 20_000


def exact_distribution(
    models: dict[str, PreTrainedModel], mix: Callable[[Tensor, Tensor], Tensor], sampling: Sampling
) -> Tensor:
    """Probability of each of the V**LENGTH continuations; ``mix(p_logits, q_logits)`` gives the conditionals."""
    return exact_mixture_distribution([models["target"], models["draft"]], lambda logits: mix(*logits), sampling)


def exact_mixture_distribution(
    models: Sequence[PreTrainedModel], mix: Callable[[list[Tensor]], Tensor], sampling: Sampling
) -> Tensor:
    """As :func:`exact_distribution` for any number of models: ``mix([warped logits of each model])``."""
    vocab = models[0].config.vocab_size
    conts = torch.tensor(list(itertools.product(range(vocab), repeat=LENGTH)))
    ids = torch.cat([PROMPT.expand(len(conts), -1), conts], dim=1)
    start = PROMPT.shape[1] - 1
    warp = reference_warp(sampling)
    with torch.no_grad():
        logits = [warp(model(ids).logits[:, start : start + LENGTH].double()) for model in models]
    probs = mix(logits)
    return probs.gather(-1, conts.unsqueeze(-1)).squeeze(-1).prod(-1)


def reference_warp(sampling: Sampling) -> Callable[[Tensor], Tensor]:
    """Temperature and top-k, written independently of decode.sampling (top-p is not used here)."""

    def warp(logits: Tensor) -> Tensor:
        logits = logits / sampling.temperature
        if sampling.top_k is not None:
            kth = logits.topk(sampling.top_k, dim=-1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        return logits

    return warp


def target_only(p: Tensor, q: Tensor) -> Tensor:
    return p.softmax(-1)


def weighted(weight: float) -> Callable[[Tensor, Tensor], Tensor]:
    return lambda p, q: weight * q.softmax(-1) + (1 - weight) * p.softmax(-1)


def contrastive(mu: float) -> Callable[[Tensor, Tensor], Tensor]:
    return lambda p, q: (p - mu * q).softmax(-1)


def empirical(decoder: SpeculativeDecoder | EnsembleDecoder, n: int) -> Tensor:
    vocab = decoder.vocab
    counts = torch.zeros(vocab**LENGTH, dtype=torch.float64)
    weights = torch.tensor([vocab ** (LENGTH - 1 - j) for j in range(LENGTH)])
    for seed in range(n):
        out = decoder.generate(PROMPT, max_new_tokens=LENGTH, seed=seed)
        counts[int((out.sequences[0, PROMPT.shape[1] :] * weights).sum())] += 1
    return counts / n


def tv_bound(exact: Tensor, n: int, trials: int = 200) -> float:
    """mean + 5 sd of the TV between ``exact`` and honest multinomial samples of size ``n``."""
    generator = torch.Generator().manual_seed(1234)
    draws = torch.multinomial(exact.float(), n * trials, replacement=True, generator=generator).view(trials, n)
    freq = torch.stack([torch.bincount(d, minlength=exact.numel()) for d in draws]).double() / n
    tvs = 0.5 * (freq - exact).abs().sum(-1)
    return float(tvs.mean() + 5 * tvs.std())


def random_head(models: dict[str, PreTrainedModel], timing: str) -> AcceptanceHead:
    torch.manual_seed(5)
    hidden = models["draft"].config.hidden_size
    if timing == "dspark":  # linear on the hidden state and the previous token's Markov embedding
        config = HeadConfig(hidden, depth=0, timing="pre", features=(PREVIOUS_TOKEN,), markov_rank=4,
                            vocab_size=models["draft"].config.vocab_size)
    elif timing == "reads":  # a pre head that also reads the request, the draft's top-k and the round so far
        config = HeadConfig(hidden, depth=2, timing="pre",
                            features=(*PRE_FEATURES, REQUEST_FEATURE, *TOP_K_FEATURES, ROUND_FEATURE))
    elif timing == "pre":
        config = HeadConfig(hidden, depth=2, timing="pre", features=PRE_FEATURES, companion_features=True)
    else:
        config = HeadConfig(hidden, depth=2, timing="post")
    return AcceptanceHead(config)


def random_profile() -> SVProfile:
    generator = torch.Generator().manual_seed(6)
    return SVProfile(
        x_edges=torch.tensor([0.0, 0.4, 0.7, 1.0]),
        y_edges=torch.tensor([0.0, 0.5, 1.0]),
        table=0.3 + 0.7 * torch.rand(3, 2, generator=generator),
        counts=torch.ones(3, 2),
        latency=torch.tensor([1.0, 1.3, 1.6, 1.9]),
    )


POLICIES: dict[str, Callable[[dict], policies.Policy]] = {
    "target_only": lambda m: policies.TargetOnly(),
    "fixed1": lambda m: policies.Fixed(1),
    "fixed4": lambda m: policies.Fixed(4),
    "heuristic": lambda m: policies.Heuristic(k0=1),
    "confidence": lambda m: policies.Confidence(tau=0.6),
    # Thresholds put the stop decision inside the range of these random heads' predictions.
    "head_pre": lambda m: policies.Head(random_head(m, "pre"), threshold=0.47),
    "head_post": lambda m: policies.Head(random_head(m, "post"), threshold=0.66),
    "head_reads": lambda m: policies.Head(random_head(m, "reads"), threshold=0.47),
    # recalibrated on each generation's own verified rounds: its stops depend on earlier verdicts, still lossless
    "head_online": lambda m: policies.StopPolicy(OnlineHead(random_head(m, "pre"), prior=0.05),
                                                 Threshold(0.47, k_max=4)),
    "head_dspark": lambda m: policies.GoodputHead(random_head(m, "dspark"), CostModel(
        t_draft=0.3, t_target=1.0, t_companion=0.0), k_max=4),
    "sv": lambda m: policies.SV(random_profile(), k=4),
    # the perfect predictors stop on the true acceptance probability (a function of p, q and y): still lossless
    "perfect": lambda m: policies.PerfectHead(threshold=0.5, k_max=4),
    "perfect_goodput": lambda m: policies.PerfectGoodput(CostModel(t_draft=0.3, t_target=1.0, t_companion=0.0),
                                                         k_max=4),
    # training-free sources under both stops; the online logistic refits every 5 rounds, so its lengths change along
    # the sample (parameters put the stops inside the range of these models' estimates)
    "margin": lambda m: policies.StopPolicy(OnlineMargin(MarginLogistic(refit_every=5, min_count=4)),
                                            Threshold(0.8, k_max=4)),
    "margin_goodput": lambda m: policies.StopPolicy(OnlineMargin(MarginLogistic(refit_every=5, min_count=4)),
                                                    Goodput(CostModel(t_draft=0.1, t_target=1.0, t_companion=0.0),
                                                            k_max=4)),
    # vLLM's released estimator from its cold start, one Newton step every 5 rounds
    "vllm": lambda m: policies.StopPolicy(VLLMEstimator(VLLMLogistic(refit_every=5)), Threshold(0.8, k_max=4)),
    "vllm_goodput": lambda m: policies.StopPolicy(VLLMEstimator(VLLMLogistic(refit_every=5)), Goodput(
        CostModel(t_draft=0.1, t_target=1.0, t_companion=0.0), k_max=4)),
    "adaedl": lambda m: policies.StopPolicy(EntropyBound(gamma=0.2), Threshold(0.6, k_max=4)),
    "adaedl_goodput": lambda m: policies.StopPolicy(EntropyBound(gamma=0.2), Goodput(
        CostModel(t_draft=0.3, t_target=1.0, t_companion=0.0), k_max=4)),
    "confidence_goodput": lambda m: policies.StopPolicy(DraftConfidence(), Goodput(
        CostModel(t_draft=0.3, t_target=1.0, t_companion=0.0), k_max=4)),
    "svip": lambda m: SVIP(h=0.97, k_max=4),
    "confidence_refit": lambda m: RefitConfidence(tau=0.3, k_max=4),
}
RULES: dict[str, tuple[Callable[[], rules.Rule], Callable[[Tensor, Tensor], Tensor]]] = {
    "speculative": (rules.Speculative, target_only),
    "weighted": (lambda: rules.Ensemble("weighted", weight=0.5), weighted(0.5)),
    "contrastive": (lambda: rules.Ensemble("contrastive", mu=0.5), contrastive(0.5)),
}
def decoder_for(models: dict, rule: rules.Rule, policy: policies.Policy, sampling: Sampling,
                compile: bool = False) -> SpeculativeDecoder:
    companion = models["companion"] if policy.companion is not None else None
    return SpeculativeDecoder(
        models["target"], models["draft"], rule=rule, policy=policy, companion=companion,
        sampling=sampling, eos_token_id=None, compile=compile,
    )


def check_case(models: dict, case: str, n: int, compile: bool = False) -> tuple[float, float]:
    rule_name, policy_name = case.split("-")
    make_rule, mix = RULES[rule_name]
    sampling = Sampling()
    decoder = decoder_for(models, make_rule(), POLICIES[policy_name](models), sampling, compile)
    exact = exact_distribution(models, mix, sampling)
    tv = float(0.5 * (empirical(decoder, n) - exact).abs().sum())
    return tv, tv_bound(exact, n)


def report(label: str, tv: float, bound: float) -> None:
    print(f"\n[exact] {label}: TV={tv:.4f} bound={bound:.4f}")


class AcceptAll(rules.Speculative):
    """Broken rule for the negative control: accepts every candidate (output ~ q, not p)."""

    def accept_probs(self, v: Tensor, q: Tensor, y: Tensor) -> Tensor:
        return torch.ones(y.shape, dtype=torch.float32, device=y.device)


def adversarial_sv_profile() -> SVProfile:
    """Acceptance 0.95 only in the top Y-bin (``Y ≥ 0.9``), 0.05 below; one X-bin (marginal 0.5).

    With latency ``[1, 1.03]`` a second verified candidate pays off, by the full ``α_2``, exactly
    when ``α_2 = 0.95`` — i.e. when ``c(y_2)/q(y_2) ≥ 0.9``, a function of ``y_2`` itself.
    """
    return SVProfile(
        x_edges=torch.tensor([0.0, 1.0]),
        y_edges=torch.tensor([0.0, 0.9, 1.0]),
        table=torch.tensor([[0.05, 0.95]]),
        counts=torch.ones(1, 2),
        latency=torch.tensor([1.0, 1.03]),
    )
