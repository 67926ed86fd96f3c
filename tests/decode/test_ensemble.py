"""EnsembleDecoder: exact ensemble distribution, greedy = argmax r, call counts, caches, stats, errors.

The exact-distribution checks reuse the enumeration / TV-bound machinery of
``tests.helpers.exact_distribution``: 3-token continuations over a vocabulary of 4, judged against the
sequence distribution of ``r`` computed independently from full forwards of every model.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from decode import EnsembleDecoder, EnsembleFn, HeadConfig, Sampling, SpeculativeDecoder, policies, rules
from decode.artifacts.serialization import load_head, save_head
from decode.ensemble import decoder as ensemble_module
from decode.head import PRE_FEATURES, AcceptanceHead
from decode.loops.runner import ModelRunner
from decode.metadata import HeadMetadata
from tests.helpers.ensemble import GAMMAS, make_fn, members, reference_greedy, reference_mix
from tests.helpers.exact_distribution import N_SLOW, AcceptAll, empirical, exact_mixture_distribution, report, tv_bound

N_ENSEMBLE = 500
WIDE_PROMPT = torch.tensor([[3, 17, 42]])
EOS = 7


def check_case(models: dict, case: str, n_samples: int) -> tuple[float, float]:
    """``case`` = ``{n}{kind}-{mode}[-t07k3]``; returns (TV, bound)."""
    spec, mode, *extra = case.split("-")
    n, kind = int(spec[0]), spec[1:]
    sampling = Sampling(temperature=0.7, top_k=3) if extra == ["t07k3"] else Sampling()
    gammas = GAMMAS.get((mode, n))
    decoder = EnsembleDecoder(members(models, n), make_fn(kind, n), gammas, mode, sampling, eos_token_id=None)
    exact = exact_mixture_distribution(members(models, n), reference_mix(kind, n), sampling)
    tv = float(0.5 * (empirical(decoder, n_samples) - exact).abs().sum())
    return tv, tv_bound(exact, n_samples)


CASES = [
    f"{n}{kind}-{mode}" for n, kind, mode in itertools.product((2, 3), ("weighted", "contrastive"), ("sd", "alternate"))
]
SLOW_ONLY = ["3weighted-alternate-t07k3", "3contrastive-plain", "2weighted-plain"]


@pytest.mark.parametrize("case", CASES)
def test_ensemble_exact_distribution(tiny, case):
    tv, bound = check_case(tiny, case, N_ENSEMBLE)
    report(f"ensemble {case} n={N_ENSEMBLE}", tv, bound)
    assert tv <= bound, f"{case}: TV {tv:.4f} exceeds {bound:.4f}"


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES + SLOW_ONLY)
def test_ensemble_exact_distribution_slow(tiny, case):
    tv, bound = check_case(tiny, case, N_SLOW)
    report(f"ensemble {case} n={N_SLOW}", tv, bound)
    assert tv <= bound, f"{case}: TV {tv:.4f} exceeds {bound:.4f}"


@pytest.mark.parametrize("n_samples", [N_ENSEMBLE, pytest.param(N_SLOW, marks=pytest.mark.slow)])
@pytest.mark.parametrize("control", ["accept_all", "three_vs_two_model_r"])
def test_ensemble_negative_controls_exceed_bound(tiny, monkeypatch, control, n_samples):
    """Accepting every proposal (incl. unverified bonus tokens) and judging against another r are detected."""
    if control == "accept_all":
        monkeypatch.setattr(ensemble_module, "_RULE", AcceptAll())
        decoder = EnsembleDecoder(members(tiny, 2), make_fn("weighted", 2), [1, 2], "alternate", eos_token_id=None)
    else:
        decoder = EnsembleDecoder(members(tiny, 3), EnsembleFn("weighted"), None, "alternate", eos_token_id=None)
    exact = exact_mixture_distribution(members(tiny, 2), reference_mix("weighted", 2), Sampling())
    tv = float(0.5 * (empirical(decoder, n_samples) - exact).abs().sum())
    bound = tv_bound(exact, n_samples)
    report(f"NEGATIVE ensemble {control} n={n_samples}", tv, bound)
    assert tv > bound, f"negative control {control} is indistinguishable: TV {tv:.4f} <= {bound:.4f}"


@pytest.mark.parametrize("kind", ["weighted", "contrastive"])
@pytest.mark.parametrize("n", [2, 3])
def test_alternate_never_needs_more_calls_than_plain(wide, n, kind):
    """SE Cor. 3.7: with every γ = 1, alternate uses at most plain's n calls per token."""
    models, fewer = members(wide, n), 0
    for temperature in (1.0, 0.0):
        sampling = Sampling(temperature=temperature)
        plain = EnsembleDecoder(models, make_fn(kind, n), mode="plain", sampling=sampling, eos_token_id=EOS)
        alternate = EnsembleDecoder(models, make_fn(kind, n), mode="alternate", sampling=sampling, eos_token_id=EOS)
        s = plain.generate(WIDE_PROMPT, max_new_tokens=24).stats
        assert s.calls == [s.generated] * n
        for seed in range(16):
            s = alternate.generate(WIDE_PROMPT + seed, max_new_tokens=24, seed=seed).stats
            assert s.total_calls <= n * s.generated, f"seed {seed}, T={temperature}: {s.calls} for {s.generated}"
            assert max(s.calls) <= s.generated
            fewer += s.total_calls < n * s.generated
    assert fewer > 0


GREEDY_MODES = [("plain", None), ("sd", 3), ("alternate", 1), ("alternate", 3)]


@pytest.mark.parametrize("kind", ["weighted", "contrastive"])
@pytest.mark.parametrize("n", [2, 3])
def test_greedy_is_argmax_of_r_in_every_mode(wide, n, kind):
    models = members(wide, n)
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 96, (1, 4), generator=generator) for _ in range(4)]
    member_differs = False
    for prompt in prompts:
        reference = reference_greedy(models, kind, prompt, 16)
        target_alone = wide["target"].generate(prompt, max_new_tokens=16, do_sample=False, min_new_tokens=16)
        member_differs |= not torch.equal(reference, target_alone)
        for mode, gamma in GREEDY_MODES:
            gammas = None if gamma is None else [gamma] + [1] * (n - 1)
            decoder = EnsembleDecoder(models, make_fn(kind, n), gammas, mode, Sampling(temperature=0.0), eos_token_id=None)
            out = decoder.generate(prompt, max_new_tokens=16, seed=3)
            assert torch.equal(out.sequences, reference), f"{mode} (γ={gamma}) is not argmax r on {prompt.tolist()}"
    assert member_differs, "the ensemble's argmax never differs from the target's: the check has no power"


@pytest.mark.parametrize("kind", ["weighted", "contrastive"])
def test_two_models_match_speculative_decoder(wide, kind):
    """For [q, p], SpeculativeDecoder's ensemble rule (tentative bonus) is alternate with γ = [K, 1]:
    greedy decoding gives the same tokens and the same calls; sd gives the same tokens."""
    rule = rules.Ensemble("weighted", weight=0.3) if kind == "weighted" else rules.Ensemble("contrastive", mu=0.5)
    greedy = Sampling(temperature=0.0)
    theirs = SpeculativeDecoder(wide["target"], wide["draft"], rule, policies.Fixed(4), sampling=greedy, eos_token_id=None)
    alternate = EnsembleDecoder(members(wide, 2), rule, [4, 1], "alternate", greedy, eos_token_id=None)
    sd = EnsembleDecoder(members(wide, 2), rule, [4, 1], "sd", greedy, eos_token_id=None)
    assert rules.Ensemble.from_function(rule.function(), 2) == rule
    for seed in range(3):
        prompt = WIDE_PROMPT + seed
        reference = theirs.generate(prompt, 24)
        out = alternate.generate(prompt, 24)
        assert torch.equal(out.sequences, reference.sequences)
        assert out.stats.calls == [reference.stats.draft_calls, reference.stats.target_calls]
        assert torch.equal(sd.generate(prompt, 24).sequences, reference.sequences)


def random_head(models: dict, timing: str) -> AcceptanceHead:
    torch.manual_seed(4)
    hidden = models["draft"].config.hidden_size
    if timing == "pre":
        return AcceptanceHead(HeadConfig(hidden, depth=2, timing="pre", features=PRE_FEATURES))
    return AcceptanceHead(HeadConfig(hidden, depth=2, timing="post"))


CONFIGS = {
    "plain": (None, None),
    "sd": ([3, 1, 1], None),
    "sd-head_post": (None, lambda m: policies.Head(random_head(m, "post"), threshold=0.5)),
    "sd-head_pre": (None, lambda m: policies.Head(random_head(m, "pre"), threshold=0.5)),
    "sd-heuristic": (None, lambda m: policies.Heuristic(k0=2)),
    "alternate": (None, None),
    "alternate-321": ([3, 2, 1], None),
}


@pytest.mark.parametrize("config", CONFIGS)
def test_stats_caches_and_single_scoring(wide, monkeypatch, config):
    """Stats identities, EOS / budget, cached forwards == from-scratch forwards, no position scored twice."""
    feed = ModelRunner.feed
    seen: set[tuple[int, tuple[int, ...]]] = set()

    def checked_feed(self, tokens, end, keep, inputs=None):
        for position in range(self.consumed, end):
            key = (id(self.model), tuple(tokens[0, : position + 1].tolist()))
            assert key not in seen, f"position {position} of the same prefix fed twice to one model"
            seen.add(key)
        logits = feed(self, tokens, end, keep, inputs)
        with torch.no_grad():
            full = self.model(tokens[:, :end]).logits[0, -keep:, : self.vocab].float()
        torch.testing.assert_close(logits, full, atol=1e-4, rtol=1e-4)
        return logits

    monkeypatch.setattr(ModelRunner, "feed", checked_feed)
    gammas, make_policy = CONFIGS[config]
    mode = config.split("-")[0]
    decoder = EnsembleDecoder(
        members(wide, 3), EnsembleFn("weighted"), gammas, mode, policy=make_policy(wide) if make_policy else None,
        eos_token_id=EOS,
    )
    rejected = 0
    for seed, max_new in [(0, 40), (1, 17), (2, 1), (3, 0), (4, 40)]:
        seen.clear()
        out = decoder.generate(WIDE_PROMPT, max_new_tokens=max_new, seed=seed)
        s, new = out.stats, out.sequences[0, WIDE_PROMPT.shape[1] :].tolist()
        assert s.generated == len(new) <= max_new
        assert EOS not in new[:-1]
        assert new[-1:] == [EOS] or s.generated == max_new
        assert s.generated == s.accepted + s.rejected + s.from_r
        assert sum(s.proposed) == s.accepted + s.rejected + s.discarded
        assert all(scored >= s.generated for scored in s.scored)
        assert s.modelled_time([0.5, 0.25, 2.0]) == pytest.approx(0.5 * s.calls[0] + 0.25 * s.calls[1] + 2.0 * s.calls[2])
        if mode == "plain":
            assert s.calls == [s.generated] * 3 and s.from_r == s.generated
        if mode == "sd":
            assert s.proposed[1:] == [0, 0]
        rejected += s.rejected
    assert mode == "plain" or rejected > 0  # rollbacks happened


def test_seeded_determinism(wide):
    fn = EnsembleFn("contrastive", mu=0.2)
    decoder = EnsembleDecoder(members(wide, 3), fn, [2, 1, 1], "alternate", eos_token_id=None)
    a, b = decoder.generate(WIDE_PROMPT, 30, seed=5), decoder.generate(WIDE_PROMPT, 30, seed=5)
    assert torch.equal(a.sequences, b.sequences) and a.stats.calls == b.stats.calls
    assert any(not torch.equal(a.sequences, decoder.generate(WIDE_PROMPT, 30, seed=s).sequences) for s in (6, 7, 8))


def test_head_metadata_is_checked(wide, tmp_path):
    path = tmp_path / "head.safetensors"
    rule = rules.Ensemble("weighted", weight=0.3)
    head = random_head(wide, "post")
    save_head(head, path, HeadMetadata(draft="micro", tokenizer_hash="x", rule=rule.spec(), sampling=Sampling(),
                                       head_config=head.config))
    head = policies.Head(load_head(path, rule=rule), threshold=0.5)
    decoder = EnsembleDecoder(members(wide, 2), rule, mode="sd", policy=head, eos_token_id=None)
    assert decoder.generate(WIDE_PROMPT, 12).stats.generated == 12
    with pytest.raises(ValueError, match="trained for rule"):
        EnsembleDecoder(members(wide, 2), EnsembleFn("weighted", weights=(0.5, 0.5)), mode="sd", policy=head)
    with pytest.raises(ValueError, match="no two-model rule"):
        EnsembleDecoder(members(wide, 3), EnsembleFn("weighted"), mode="sd", policy=head)


def test_invalid_arguments(wide):
    two, three = members(wide, 2), members(wide, 3)
    cases = [
        (lambda: EnsembleDecoder(three, rules.Ensemble()), "two models"),
        (lambda: EnsembleDecoder(two, EnsembleFn("weighted", weights=(0.5, 0.6))), "sum to 1"),
        (lambda: EnsembleDecoder(three, EnsembleFn("weighted", weights=(0.5, 0.5))), "3 weights"),
        (lambda: EnsembleDecoder(three, EnsembleFn("contrastive", mu=(0.1,))), "2 mu values"),
        (lambda: EnsembleDecoder(two[:1]), "at least 2"),
        (lambda: EnsembleDecoder(two, mode="fast"), "unknown mode"),
        (lambda: EnsembleDecoder(two, proposal_lengths=[0, 1]), "proposal_lengths"),
        (lambda: EnsembleDecoder(two, mode="alternate", policy=policies.Fixed(2)), "mode='sd' only"),
        (lambda: EnsembleDecoder(two, proposal_lengths=[2, 1], mode="sd", policy=policies.Fixed(2)), "not both"),
        (lambda: EnsembleDecoder(two, mode="sd", policy=policies.Oracle()), "not supported"),
        (lambda: EnsembleFn("weighted", mu=0.1), "not mu"),
    ]
    for build, message in cases:
        with pytest.raises(ValueError, match=message):
            build()
    decoder = EnsembleDecoder(two, eos_token_id=None)
    with pytest.raises(ValueError, match="batch size 1"):
        decoder.generate(torch.tensor([[1, 2], [3, 4]]), 5)
    with pytest.raises(ValueError, match="max_new_tokens"):
        decoder.generate(WIDE_PROMPT, -1)


def test_bench_runs_on_saved_micro_models(tmp_path, capsys, make_lm):
    from benchmarks import ensemble as bench_ensemble

    make_lm(64, seed=31, hidden=32, layers=2).save_pretrained(tmp_path / "target")
    make_lm(64, seed=32).save_pretrained(tmp_path / "draft")
    make_lm(64, seed=33).save_pretrained(tmp_path / "companion")
    rows = bench_ensemble.main(["--zoo-dir", str(tmp_path), "--prompts", "1", "--max-new-tokens", "6", "--gammas", "2"])
    printed = capsys.readouterr().out
    assert "alternate" in printed and "sd" in printed and "plain" in printed
    assert {row.tokens for row in rows} == {6}
