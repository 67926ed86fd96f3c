"""Compiled decoding (``compile=True``, :mod:`decode.compile`) decodes as eager decoding does, and leaves nothing behind.

Float32 micro models: the compiled kernels' rounding differs from eager's far below any argmax gap, so greedy
outputs are identical token for token, and sampled ones keep the rule's exact distribution.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch._dynamo.utils

from decode import EnsembleDecoder, SpeculativeDecoder, policies, rules
from decode.compile import owner as owner_module
from decode.compile.config import DEFAULT
from decode.compile.owner import CompiledModels, attached
from decode.compile.store import CompiledStoreNotice
from decode.ensemble_fn import EnsembleFn
from tests.helpers.compiler import needs_compiler
from tests.helpers.exact_distribution import check_case, report
from tests.helpers.micro_models import micro_feature_draft, micro_lm

POLICIES = {
    "target_only": lambda: policies.TargetOnly(),
    "fixed3": lambda: policies.Fixed(3),
    "confidence": lambda: policies.Confidence(tau=0.5),
}
PROMPTS = ([3, 1, 4], [1, 5, 9, 2, 6, 5, 3], list(range(40, 70)))  # the last is longer than a compiled feed


def greedy_pair(models, policy: policies.Policy, draft=None) -> tuple[SpeculativeDecoder, SpeculativeDecoder]:
    draft = models["draft"] if draft is None else draft
    return tuple(SpeculativeDecoder(models["target"], draft, rule=rules.Greedy(), policy=policy, eos_token_id=None,
                                    compile=compile) for compile in (False, True))


@needs_compiler
@pytest.mark.parametrize("name", list(POLICIES))
def test_compiled_greedy_decoding_is_eager_greedy_decoding(wide, name):
    eager, fast = greedy_pair(wide, POLICIES[name]())
    for prompt in PROMPTS:
        ids = torch.tensor([prompt])
        expected, got = eager.generate(ids, 24), fast.generate(ids, 24)
        assert torch.equal(got.sequences, expected.sequences), f"{name}, prompt of {len(prompt)}"
        assert (got.stats.target_calls, got.stats.draft_calls) == (expected.stats.target_calls,
                                                                   expected.stats.draft_calls)
    assert fast.compiled_models()["target"] is not None and fast.compiled_models()["target"].log.graphs >= 1


@needs_compiler
@pytest.mark.parametrize("first_layer", ["fc", "eagle3"])
def test_a_feature_draft_decodes_compiled_as_eager(wide, first_layer):
    subset = list(range(64)) if first_layer == "eagle3" else None
    draft = micro_feature_draft(wide["target"], seed=31, subset=subset, first_layer=first_layer)
    eager, fast = greedy_pair(wide, policies.Fixed(3), draft=draft)
    for prompt in PROMPTS:
        ids = torch.tensor([prompt])
        got, expected = fast.generate(ids, 24), eager.generate(ids, 24)
        assert torch.equal(got.sequences, expected.sequences)
        assert (got.stats.accepted, got.stats.draft_calls) == (expected.stats.accepted, expected.stats.draft_calls)
    assert fast.compiled_models()["draft"].log.graphs >= 1


@needs_compiler
def test_another_prompt_length_compiles_nothing(wide):
    _, fast = greedy_pair(wide, policies.Fixed(3))
    fast.generate(torch.tensor([PROMPTS[0]]), 24)  # compiles the graph of every feed length
    fast.generate(torch.tensor([PROMPTS[1]]), 24)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for length in (2, 5, 11, 16, 17, 33):
        fast.generate(torch.tensor([list(range(1, length + 1))]), 24)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs
    assert graphs > 0  # negative control: the counter does count this process's graphs


@needs_compiler
def test_the_first_step_on_a_cache_length_compiles_every_feed_length():
    """Which feed lengths a decode meets depends on what it drafts and accepts: the first short feed on a cache length
    runs them all on stand-in tokens, cropped off again, so nothing is left to compile while a decode is timed."""
    models = {"target": micro_lm(96, seed=21, hidden=32, layers=2, init=0.3),
              "draft": micro_lm(96, seed=22, hidden=16, init=0.3)}
    eager, fast = greedy_pair(models, policies.TargetOnly())
    ids = torch.tensor([PROMPTS[1]])
    limit = torch._dynamo.config.recompile_limit
    got = fast.generate(ids, 24)
    assert torch.equal(got.sequences, eager.generate(ids, 24).sequences)
    # the recompile limit is raised around the calls that compile only: the process's setting is as it was
    assert torch._dynamo.config.recompile_limit == limit < DEFAULT.recompile_limit
    assert (got.stats.compile, got.stats.eager_reason) == (DEFAULT, None)
    compiled = fast.compiled_models()["target"]
    # the target alone feeds one token a step (padded to two), and the graph of two to 16 tokens serves it and every
    # verification's feed
    assert (compiled.log.graphs, compiled.log.shapes) == (1, {(2, 256)})
    # a call with other arguments (the hidden states a feature draft's tape reads) has graphs of its own, made ready
    # at its first short feed too
    with torch.inference_mode():
        cache = compiled.acquire(8)
        try:
            compiled(ids, cache, 1)
            hidden = compiled(ids[:, :1], cache, 1, output_hidden_states=True).hidden_states[-1][0, -1]
        finally:
            compiled.release(cache)
    expected = models["target"](input_ids=torch.cat([ids, ids[:, :1]], dim=1), output_hidden_states=True)
    torch.testing.assert_close(hidden, expected.hidden_states[-1][0, -1], rtol=1e-4, atol=1e-4)
    assert compiled.log.graphs == 2


@needs_compiler
def test_prompts_in_other_cache_lengths_decode_as_eager():
    """Each cache length keeps graphs of its own: after a prompt whose cache is longer, a short prompt's cache is
    written by its own graphs (one graph made dynamic in the cache's length wrote to the longer cache)."""
    target = micro_lm(96, seed=21, hidden=32, layers=2, init=0.3, context=1024)
    draft = micro_lm(96, seed=22, hidden=16, init=0.3, context=1024)
    eager, fast = greedy_pair({"target": target, "draft": draft}, policies.Fixed(3))
    generator = torch.Generator().manual_seed(0)
    for length in (7, 300, 9):  # caches of 256, 512 and again 256 columns
        ids = torch.randint(0, 96, (1, length), generator=generator)
        assert torch.equal(fast.generate(ids, 24).sequences, eager.generate(ids, 24).sequences), f"prompt of {length}"
    assert {cache for _, cache in fast.compiled_models()["target"].log.shapes} == {256, 512}


@needs_compiler
def test_two_caches_of_one_length_each_get_their_own_tokens(wide):
    """A frozen graph writes to the cache it was compiled with: a second cache of that length (two decodes of one
    model at once) runs eager, so each cache holds its own tokens and scores them as the eager model does."""
    model = wide["target"]
    owner = CompiledModels()
    fast = owner.open([model])[0]
    prompt = torch.tensor([PROMPTS[1]])
    eager_feeds = fast.log.eager_feeds
    with owner, torch.inference_mode():  # as generate: the pooled caches are inference tensors
        caches = [fast.acquire(8), fast.acquire(8)]
        try:
            for cache in caches:
                fast(prompt, cache, 1)
            steps = [fast(prompt[:, :1], cache, 1).logits[0, -1] for cache in caches]
            expected = model(input_ids=torch.cat([prompt, prompt[:, :1]], dim=1)).logits[0, -1]
        finally:
            for cache in caches:
                fast.release(cache)
    assert [int(cache.layers[0].cumulative_length) for cache in caches] == [prompt.shape[1] + 1] * 2
    for got in steps:
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert fast.log.graphs >= 1
    assert fast.log.eager_feeds - eager_feeds == 1  # the second cache's step, counted


@needs_compiler
@pytest.mark.parametrize("mode", ["plain", "alternate", "sd"])
def test_the_ensemble_decoder_decodes_compiled_as_eager(wide, mode):
    """Sampled at T = 1 with the same seeds, the three-model ensemble's outputs and calls are the eager ones."""
    models = [wide["draft"], wide["companion"], wide["target"]]
    eager, fast = (EnsembleDecoder(models, EnsembleFn("weighted"), [2, 1, 1], mode, eos_token_id=None, compile=compile)
                   for compile in (False, True))
    for seed, prompt in enumerate(PROMPTS):
        expected, got = eager.generate(torch.tensor([prompt]), 20, seed), fast.generate(torch.tensor([prompt]), 20, seed)
        assert torch.equal(got.sequences, expected.sequences), f"{mode}, prompt of {len(prompt)}"
        assert got.stats.calls == expected.stats.calls
    assert all(model is not None and model.log.graphs >= 1 for model in fast.compiled_models())


@needs_compiler
@pytest.mark.parametrize("case", ["speculative-fixed4", "speculative-head_pre", "speculative-margin",
                                  "speculative-sv", "weighted-confidence"])
def test_compiled_decoding_keeps_the_exact_distribution(tiny, case):
    tv, bound = check_case(tiny, case, 1000, compile=True)
    report(f"{case} compiled n=1000", tv, bound)
    assert tv <= bound, f"{case} compiled: TV {tv:.4f} exceeds {bound:.4f}"


def fresh_pair() -> dict:
    """A target and a draft no other test has opened compiled forwards on."""
    return {"target": micro_lm(96, seed=21, hidden=32, layers=2, init=0.3),
            "draft": micro_lm(96, seed=22, hidden=16, init=0.3)}


def test_without_a_compiler_it_decodes_eager_with_one_line(monkeypatch):
    monkeypatch.setattr(owner_module.shutil, "which", lambda name: None)
    eager, fast = greedy_pair(fresh_pair(), policies.Fixed(3))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = fast.generate(torch.tensor([PROMPTS[0]]), 12)
        again = fast.generate(torch.tensor([PROMPTS[0]]), 12)  # no second line
    lines = [str(w.message) for w in caught]
    assert len(lines) == 1 and "no C++ compiler" in lines[0] and "runs eager" in lines[0]
    assert fast.compiled_models() == {"target": None, "draft": None, "companion": None}
    assert (got.stats.compile, got.stats.eager_reason) == (None, lines[0]) == (again.stats.compile,
                                                                              again.stats.eager_reason)
    assert torch.equal(got.sequences, eager.generate(torch.tensor([PROMPTS[0]]), 12).sequences)


@needs_compiler
def test_a_compiled_model_can_be_copied_and_the_copy_decodes_eager(wide):
    import copy

    _, fast = greedy_pair(wide, policies.Fixed(3))
    fast.generate(torch.tensor([PROMPTS[0]]), 8)
    twin = copy.deepcopy(wide["target"])
    eager = SpeculativeDecoder(twin, wide["draft"], rule=rules.Greedy(), policy=policies.Fixed(3), eos_token_id=None)
    ids = torch.tensor([PROMPTS[1]])
    assert torch.equal(eager.generate(ids, 16).sequences, fast.generate(ids, 16).sequences)


def test_a_compilation_that_fails_leaves_the_model_eager_after_one_line(monkeypatch):
    """A compilation that fails (here: no Python headers for inductor's C++) is one warning line, once; the decode's
    stats say it ran eager and why, and its tokens are the eager ones."""
    from torch._inductor.exc import CppCompileError

    def broken(**kwargs):
        raise CppCompileError(["c++"], "fatal error: Python.h: No such file or directory")

    monkeypatch.setattr(torch, "compile", lambda model, **options: broken)
    eager, fast = greedy_pair(fresh_pair(), policies.TargetOnly())
    target = fast.compiled_models()["target"]
    ids = torch.tensor([PROMPTS[1]])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = fast.generate(ids, 12)
        again = fast.generate(ids, 12)  # no second line: the model stays eager
    # besides the store's line that the graphs are being built (at most once, before the failure; none where a
    # model of these weights was compiled earlier in the session)
    lines = [str(w.message) for w in caught if not issubclass(w.category, CompiledStoreNotice)]
    assert len(lines) == 1 and "\n" not in lines[0]
    assert sum(issubclass(w.category, CompiledStoreNotice) for w in caught) <= 1
    assert "torch.compile failed" in lines[0] and "Python.h" in lines[0] and "decodes eager" in lines[0]
    assert target.failed and target.eager_reason == lines[0]
    for out in (got, again):
        assert (out.stats.compile, out.stats.eager_reason) == (None, lines[0])
        assert torch.equal(out.sequences, eager.generate(ids, 12).sequences)


def test_an_eager_decoder_records_no_compile(wide):
    eager, _ = greedy_pair(wide, policies.Fixed(3))
    stats = eager.generate(torch.tensor([PROMPTS[0]]), 8).stats
    assert (stats.compile, stats.eager_reason) == (None, None)


def test_owners_of_one_model_share_its_compiled_forwards_and_the_last_close_removes_the_hook():
    """One model has one open CompiledModel (two pools of it would write to each other's caches): a second owner
    shares it, and the hook leaves the model when the last owner closes."""
    models = fresh_pair()
    heads = [model.get_output_embeddings() for model in models.values()]
    first, second = CompiledModels(), CompiledModels()
    (a, _), (b, _) = first.open(list(models.values())), second.open(list(models.values()))
    assert a is b is attached(models["target"]) and len(heads[0]._forward_hooks) == 1
    first.close()
    assert not a.closed and len(heads[0]._forward_hooks) == 1
    second.close()
    assert a.closed and attached(models["target"]) is None
    assert all(len(head._forward_hooks) == 0 for head in heads)
    with pytest.raises(RuntimeError, match="closed"):
        a(torch.tensor([[1]]), None, 1)


@needs_compiler
def test_closing_a_decoder_removes_its_hooks_and_a_reopened_one_decodes_as_eager():
    """After ``close`` (or a ``with`` block) the caller's models keep no hook; a later decode opens the forwards
    again on the slot and caches the model's graphs were traced with, and decodes as eager (with fresh caches the old
    graphs, still in dynamo's cache, wrote to the dropped ones)."""
    models = fresh_pair()
    eager, fast = greedy_pair(models, policies.Fixed(3))
    ids = torch.tensor([PROMPTS[1]])
    expected = eager.generate(ids, 16).sequences
    with fast:
        assert torch.equal(fast.generate(ids, 16).sequences, expected)
        assert len(models["target"].get_output_embeddings()._forward_hooks) == 1
    assert all(len(model.get_output_embeddings()._forward_hooks) == 0 for model in models.values())
    with fast:
        assert torch.equal(fast.generate(ids, 16).sequences, expected)
        assert fast.compiled_models()["target"].log.eager_feeds == 0  # on the bound caches, not eager beside them
    assert all(len(model.get_output_embeddings()._forward_hooks) == 0 for model in models.values())


@needs_compiler
def test_a_one_token_feed_into_the_caches_last_column_runs_eager_and_scores_as_eager():
    """A one-token feed is padded to two; where the cache has one column left it runs eager instead of writing past
    the cache."""
    model = micro_lm(96, seed=24, hidden=32, layers=2, init=0.3)
    owner = CompiledModels()
    (compiled,) = owner.open([model])
    ids = torch.randint(0, 96, (1, 256), generator=torch.Generator().manual_seed(0))
    try:
        with torch.inference_mode():
            cache = compiled.acquire(256)
            compiled(ids[:, :251], cache, 1)  # the prompt (eager)
            compiled(ids[:, 251:255], cache, 1)  # a short feed: prepares the graph
            eager_before = compiled.log.eager_feeds
            last = compiled(ids[:, 255:256], cache, 1).logits[0, -1]  # the cache's last column: no room for a pad
            assert int(cache.get_seq_length()) == 256
            expected = model(input_ids=ids).logits[0, -1]
            torch.testing.assert_close(last, expected, rtol=1e-4, atol=1e-4)
            assert compiled.log.eager_feeds == eager_before  # ran eager for room, not for a second cache
            compiled.release(cache)
    finally:
        owner.close()
