"""The zoo's realism figures: greedy oracle counting, confidence AUROC, and the build's hard check."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from data_gen.zoo import Zoo, ensure_zoo
from data_gen.zoo.build import ZooRealismError
from data_gen.zoo.realism import PAPER_COSTS, Realism, RealismTargets, acceptance, confidence_auroc, greedy_oracle_gain
from data_gen.zoo.summary import realism_table
from decode.costs import CostModel
from decode.zoo_dir import METADATA_FILE

from tests.data_gen.test_zoo import TINY


def test_greedy_oracle_gain_counts_rounds_as_thm_4_1() -> None:
    # One row: accept, accept, reject, accept, accept (5 positions, then the budget ends).
    accepted = torch.tensor([[True, True, False, True, True]])
    mask = torch.ones_like(accepted)
    costs = CostModel(t_draft=1.0, t_target=10.0, t_companion=0.0)
    # Oracle: round 1 drafts 2 (both accepted), emits 3; round 2 may draft 1 (the target emits the
    # last token), emits 2: 5 tokens for 3 draft + 2 target calls = 23 s. K = 2: the same rounds;
    # K = 3 drafts 3 + 1 (24 s); K = 1: rounds emit 2, 1 (rejection), 2 -> 3 + 30 = 33 s.
    gain, best_k = greedy_oracle_gain(accepted, mask, costs)
    assert best_k == 2
    assert gain == pytest.approx(1.0)
    # A mask of two positions: one round drafting one token for oracle and K = 1 alike.
    gain, best_k = greedy_oracle_gain(accepted, torch.tensor([[1, 1, 0, 0, 0]]).bool(), costs)
    assert best_k == 1 and gain == pytest.approx(1.0)


def test_greedy_oracle_beats_fixed_k_when_runs_vary() -> None:
    runs = [0, 8, 0, 8, 0, 8]  # accepted-run lengths alternate: no single K fits both
    row = sum(([True] * r + [False] for r in runs), [])
    accepted = torch.tensor([row])
    gain, _ = greedy_oracle_gain(accepted, torch.ones_like(accepted))
    assert gain > 1.3


def _outcomes(sharp: bool, positions: int, vocab: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Target / draft log-probs: sharp positions (both put 0.99 on token 0), or flat ones (draft
    uniform, target 0.95 on one token the draft rarely proposes)."""
    p, q = torch.full((positions, vocab), 0.01 / (vocab - 1)), torch.full((positions, vocab), 0.01 / (vocab - 1))
    if sharp:
        p[:, 0], q[:, 0] = 0.99, 0.99
    else:
        p = torch.full((positions, vocab), 0.05 / (vocab - 1))
        p[:, 1] = 0.95
        q = torch.full((positions, vocab), 1.0 / vocab)
    return p.log()[None], q.log()[None]


def test_confidence_auroc_is_high_when_confident_drafts_are_the_accepted_ones() -> None:
    sharp_p, sharp_q = _outcomes(True, 400)
    flat_p, flat_q = _outcomes(False, 400)
    log_p, log_q = torch.cat([sharp_p, flat_p], dim=1), torch.cat([sharp_q, flat_q], dim=1)
    mask = torch.ones(log_p.shape[:2], dtype=torch.bool)
    assert confidence_auroc(log_p, log_q, mask, seed=0) > 0.9
    assert acceptance(sharp_p, sharp_q, mask[:, :400]) == pytest.approx(1.0)


def test_confidence_auroc_is_chance_when_the_draft_says_nothing() -> None:
    # Negative control: every position has the same draft (uniform), and the target is a random
    # one-hot-ish distribution, so log q(y) is constant and carries no information.
    generator = torch.Generator().manual_seed(1)
    positions, vocab = 4000, 8
    target_token = torch.randint(0, vocab, (positions,), generator=generator)
    p = torch.full((positions, vocab), 0.2 / (vocab - 1))
    p[torch.arange(positions), target_token] = 0.8
    q = torch.full((positions, vocab), 1.0 / vocab)
    mask = torch.ones(1, positions, dtype=torch.bool)
    auroc = confidence_auroc(p.log()[None], q.log()[None], mask, seed=0)
    # Ties everywhere: AUROC is exactly 0.5 up to the sampling noise bound of ~4 sigma.
    sigma = math.sqrt((1 / 800 + 1 / 3200) / 12)
    assert abs(auroc - 0.5) < 4 * sigma


def test_build_fails_and_writes_nothing_when_the_trio_is_not_realistic(tmp_path: Path) -> None:
    with pytest.raises(ZooRealismError, match="does not behave like a real draft / target pair"):
        ensure_zoo(tmp_path / "strict", recipe=TINY)
    assert not (tmp_path / "strict" / METADATA_FILE).exists()
    assert not list(tmp_path.glob(".strict.tmp-*"))


def test_metadata_and_summary_carry_the_realism_figures(tmp_path: Path) -> None:
    zoo: Zoo = ensure_zoo(tmp_path / "z", recipe=TINY, check_realism=False)
    record = dict(zoo.metadata["realism"])
    failures = record.pop("failures")
    realism = Realism(**record)
    assert failures == realism.failures()
    assert 0.0 <= realism.acceptance <= 1.0 and 0.0 <= realism.confidence_auroc <= 1.0
    assert realism.greedy_oracle_gain >= 1.0 - 1e-9  # the oracle never loses to a fixed K
    assert realism.acceptance == zoo.metadata["models"]["draft"]["acceptance_vs_target"]
    assert realism_table(zoo).row_count == 5
    assert PAPER_COSTS.t_draft / PAPER_COSTS.t_target == pytest.approx(0.21, abs=0.01)


def test_only_enforced_figures_fail_a_build() -> None:
    realistic_but_unconfident = Realism(acceptance=0.7, confidence_auroc=0.55, greedy_oracle_gain=1.4,
                                        greedy_best_fixed_k=3, loss_gap=0.3, companion_between=True)
    assert realistic_but_unconfident.failures() == [
        "AUROC of draft confidence log q(y) vs sampled accept = 0.550, target >= 0.7"
    ]
    auroc_tracked = RealismTargets(enforced=RealismTargets().enforced - {"confidence_auroc"})
    assert realistic_but_unconfident.failures(auroc_tracked) == []
    (auroc,) = [c for c in realistic_but_unconfident.checks(auroc_tracked) if c.name == "confidence_auroc"]
    assert not auroc.ok and not auroc.enforced
    realistic_but_unconfident = dataclasses.replace(realistic_but_unconfident, confidence_auroc=0.75)
    assert realistic_but_unconfident.failures() == []
    too_close = dataclasses.replace(realistic_but_unconfident, loss_gap=0.06)
    assert too_close.failures() == ["held-out loss gap draft - target (nats) = 0.060, target >= 0.2"]
