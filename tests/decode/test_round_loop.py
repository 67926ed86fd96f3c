"""The one round loop: every speculative decode goes through RoundLoop; the typed draft round keeps its offsets."""

from __future__ import annotations

import pytest
import torch

from decode import EnsembleDecoder, EnsembleFn, Sampling, SpeculativeDecoder, policies, rules
from decode.draft_round import DraftRound, DraftStep
from decode.loops.round_loop import RoundLoop

PROMPT = torch.tensor([[3, 17, 42]])


@pytest.fixture
def rounds(monkeypatch) -> list[int]:
    """The number of rows of every round RoundLoop runs."""
    seen: list[int] = []
    run_round = RoundLoop._round

    def counted(self, rows):
        seen.append(len(rows))
        return run_round(self, rows)

    monkeypatch.setattr(RoundLoop, "_round", counted)
    return seen


def test_one_prompt_a_batch_and_the_ensembles_sd_mode_run_in_the_round_loop(wide, rounds):
    decoder = SpeculativeDecoder(wide["target"], wide["draft"], rule=rules.Speculative(), policy=policies.Fixed(3),
                                 eos_token_id=None)
    one = decoder.generate(PROMPT, 12, seed=0).stats
    assert len(rounds) == one.rounds > 0 and set(rounds) == {1}
    rounds.clear()
    batch = decoder.generate([PROMPT[0], PROMPT[0, :2]], 12, seed=0)
    assert len(rounds) == batch.totals.target_calls and max(rounds) == 2
    rounds.clear()
    sd = EnsembleDecoder([wide["draft"], wide["companion"], wide["target"]], EnsembleFn("weighted"), [3, 1, 1], "sd",
                         eos_token_id=None)
    stats = sd.generate(PROMPT, 12, seed=0).stats
    assert len(rounds) == stats.calls[1] > 0  # each member is called once per round
    rounds.clear()
    alternate = EnsembleDecoder([wide["draft"], wide["target"]], EnsembleFn("weighted"), [1, 2], "alternate",
                                eos_token_id=None)
    alternate.generate(PROMPT, 12, seed=0)
    assert rounds == []  # alternate proposals are scheduled by their own engine, not in rounds


def test_the_draft_round_reads_its_candidates_by_record():
    """``q`` of candidate i is the step it was drawn from; a withdrawn candidate's step is the next one again."""
    round_ = DraftRound(Sampling())
    steps = [DraftStep(torch.full((4,), float(i)), torch.full((2,), float(i))) for i in range(3)]
    for i, step in enumerate(steps):
        round_.next = step
        round_.draw(torch.tensor(i))
    round_.next = DraftStep(torch.full((4,), 9.0))
    assert round_.i == 3 and round_.tokens().tolist() == [0, 1, 2]
    assert round_.q_logits()[:, 0].tolist() == [0.0, 1.0, 2.0] and round_.latest.step.hidden[0] == 2.0
    assert round_.verified_q(1)[:, 0].tolist() == [0.0, 1.0]  # candidate 1 and the step after it
    assert round_.verified_q(3)[:, 0].tolist() == [0.0, 1.0, 2.0, 9.0]  # the draft reached the bonus position
    assert round_.reached(3) and round_.draws(3) is None
    round_.next = None
    round_.withdraw()
    assert round_.i == 2 and round_.next is steps[2] and round_.reached(2) and not round_.reached(3)
    assert round_.verified_q(2)[:, 0].tolist() == [0.0, 1.0, 2.0]


def test_a_member_draft_defers_the_bonus_until_it_has_scored_the_position(wide, monkeypatch):
    """The n-model ensemble draws the token after a fully accepted round from r once the proposer has scored it:
    with every proposal accepted (a weight-1 proposer), every round's last token comes from ``Rule.complete``."""
    from decode.ensemble.sd_mode import MemberEnsemble

    completions = []
    complete = MemberEnsemble.complete

    def counted(self, *args):
        completions.append(1)
        return complete(self, *args)

    monkeypatch.setattr(MemberEnsemble, "complete", counted)
    sd = EnsembleDecoder([wide["draft"], wide["target"]], EnsembleFn("weighted", weights=(1.0, 0.0)), [3, 1], "sd",
                         eos_token_id=None)
    stats = sd.generate(PROMPT, 20, seed=0).stats
    assert stats.rejected == 0 and stats.from_r == len(completions) > 0
    assert stats.generated == stats.accepted + stats.from_r == 20
