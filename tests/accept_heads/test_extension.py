"""Extending the project from one file: a new length policy, a new acceptance source and new rules, each declared
here alone.

The policy (its class, its spec and the evaluation's traits of it) is swept on dev, reported in the tables, drawn,
timed by the wall clock and put on the batch axis by ``accept_heads.evaluate``; a training-free acceptance source (one
class and one registry line) gets the threshold stop, the goodput stop and the survival budget, a league row and the
wall clock; a parameterless rule gets its label column from collection and trains a head; a rule with a parameter
does too, with the parameter its config gives it, and the evaluation sweeps that parameter on dev. No other file
names any of them (the registries are :data:`decode.policy_specs.POLICY_SPECS`,
:data:`decode.policies.sources.SOURCES`, :data:`accept_heads.measure.families.FAMILIES` and
:data:`decode.rules.RULES`); the fixtures register each for one test, as the decorators would where it is defined.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from rich.console import Console
from torch import Tensor

from accept_heads.evaluate import evaluate
from accept_heads.evaluation.figures import FIGURES
from accept_heads.evaluation.report import league_table, results_table, wallclock_table
from accept_heads.measure.families import FAMILIES, STOP_TRAITS, evaluated, family, family_names
from accept_heads.train import train
from ahconf.schema import ConfigError
from data_gen.collect import collect
from data_gen.shards import load_split
from decode.draft_round import DraftRound
from decode.policies.base import Policy, PolicyInputs
from decode.policies.sources import SOURCES, AcceptanceSource, register_source
from decode.policy_specs import POLICY_SPECS, CountParameter, PolicySpec, policy_spec, register_policy
from decode.rules import RULES, Rule, register_rule
from tests.helpers.config import DATA_OVERRIDES, EVAL_OVERRIDES, TRAIN_OVERRIDES, model_overrides
from tests.helpers.evaluation import write_artifacts


class Alternating(Policy):
    """Draft ``k`` candidates on odd rounds and one on even rounds."""

    def __init__(self, k: int) -> None:
        self.k, self.rounds = k, 0

    def reset(self) -> None:
        self.rounds = 0

    def k_cap(self) -> int:
        return self.k if self.rounds % 2 == 0 else 1

    def end_round(self, drafted: int, verified: int, accepted: int) -> None:
        self.rounds += 1


@dataclass(frozen=True)
class AlternatingSpec(CountParameter, PolicySpec):
    kind: ClassVar[str] = "alternating"

    def build(self, inputs: PolicyInputs) -> Policy:
        return Alternating(self.k)


#: The evaluation's traits of the kind (``@evaluated(**TRAITS)`` above ``@register_policy``): K chosen on dev over
#: its own grid, rows batched as alone, timed by the wall clock, drawn in magenta.
TRAITS: dict[str, Any] = {"symbol": "K", "grid": (2.0, 4.0), "rows_alone": True, "timed": True, "color": "magenta"}


class TopTwo(AcceptanceSource):
    """A training-free source: the draft's probability mass on its two most likely tokens, ``q(top 1) + q(top 2)``."""

    name: ClassVar[str] = "top2"

    def estimate(self, state: DraftRound) -> float:
        return float(state.sampling.feature_probs(state.latest.step.q_logits).topk(2).values.sum())


class ArgmaxMatch(Rule):
    """A parameterless lossy rule: accept a candidate exactly when it is the verifier's most likely token."""

    name: ClassVar[str] = "argmax-match"
    lossless: ClassVar[bool] = False

    def accept_probs(self, v: Tensor, q: Tensor, y: Tensor) -> Tensor:
        return (v.argmax(-1) == y).float()

    def expected_accept_probs(self, v: Tensor, q: Tensor) -> Tensor:
        return q.gather(-1, v.argmax(-1, keepdim=True)).squeeze(-1)

    def reject_probs(self, v: Tensor, q: Tensor) -> Tensor:
        return v


@dataclass(eq=False, repr=False)
class Tempered(Rule):
    """A lossy rule with a parameter: speculative sampling's acceptance ``min(1, p/q)`` raised to ``power``; the
    evaluation sweeps ``power`` on dev."""

    power: float = 2.0
    name: ClassVar[str] = "tempered"
    lossless: ClassVar[bool] = False
    swept: ClassVar[str | None] = "power"

    def accept_probs(self, v: Tensor, q: Tensor, y: Tensor) -> Tensor:
        return super().accept_probs(v, q, y) ** self.power


@pytest.fixture()
def alternating() -> Iterator[type[PolicySpec]]:
    evaluated(**TRAITS)(register_policy(AlternatingSpec))
    yield AlternatingSpec
    del POLICY_SPECS[AlternatingSpec.kind], FAMILIES[AlternatingSpec.kind]


@pytest.fixture()
def top_two() -> Iterator[type[AcceptanceSource]]:
    register_source(TopTwo)  # the one registry line (``@register_source`` where it is defined)
    yield TopTwo
    del SOURCES[TopTwo.name]


@pytest.fixture()
def argmax_match() -> Iterator[type[Rule]]:
    register_rule(ArgmaxMatch)
    yield ArgmaxMatch
    del RULES[ArgmaxMatch.name]


@pytest.fixture()
def tempered() -> Iterator[type[Rule]]:
    register_rule(Tempered)
    yield Tempered
    del RULES[Tempered.name]


def rendered(table: Any) -> str:
    console = Console(file=io.StringIO(), width=400)
    console.print(table)
    return console.file.getvalue()


def collection_free(make_config: Any, micro_trio: dict[str, Path], micro_root: Path, tmp_path: Path,
                    *overrides: str) -> Any:
    """An evaluation of the speculative rule on the session's collected micro data and heads written here, with the
    wall clock on test and the batch axis at B = 2 (no HF baseline)."""
    write_artifacts(tmp_path / "heads", micro_trio["draft"])
    return make_config(*model_overrides(micro_trio), *DATA_OVERRIDES, *EVAL_OVERRIDES, f"paths.root={tmp_path}",
                       f"paths.data_dir={micro_root / 'tiny' / 'data'}", f"paths.head_dir={tmp_path / 'heads'}",
                       "evaluate.rules=[speculative]", "evaluate.hf.baselines=false", "evaluate.wallclock.sets=[test]",
                       "evaluate.wallclock.threads=1", "evaluate.batch_axis.sizes=[2]", "evaluate.batch_axis.prompts=2",
                       *overrides)


def test_a_policy_declared_in_one_file_is_swept_tabled_timed_batched_and_drawn(alternating, make_config, micro_trio,
                                                                                 micro_root, tmp_path):
    config = collection_free(make_config, micro_trio, micro_root, tmp_path, "evaluate.bounds=false")
    results = evaluate(config.evaluate_job())
    table = results.table
    rows = table[table["family"] == "alternating"]
    dev = rows[rows["role"] == "dev"]
    assert sorted(dev["param"]) == [2.0, 4.0]  # its declared grid, swept on dev
    assert (dev["chosen_on"] != "").all() and (dev["chosen_on"] == "dev").sum() == 1
    held_out = rows[rows["role"] != "dev"]
    assert len(held_out) and (held_out["chosen_on"] == "dev").all()  # applied on test at its dev choice
    assert (held_out["generated"] > 0).all() and held_out["speedup_fixed_cost"].notna().all()
    (choice,) = [c for c in results.metadata.selection if c.family == "alternating"]
    label = f"alternating(K={int(choice.value)})"
    assert label in rendered(results_table(table, "test", results.metadata.cost_models["cost"]))
    wall = results.wallclock
    assert list(wall.loc[wall["family"] == "alternating", "policy"]) == [label]  # timed at its dev choice
    caption = results.metadata.cost_models["cost"].caption
    assert label in rendered(wallclock_table(wall, results.metadata.wallclock, caption))
    assert any(p.startswith("alternating(K=") for p in results.batch_axis["policy"])  # on the batch axis
    for name in ("pareto", "throughput_vs_k"):  # drawn at its dev choice, the best run of its family
        figure = FIGURES[name](results)
        assert label in {text.get_text() for ax in figure.axes for text in ax.get_legend().get_texts()}, name
    assert "alternating" in family_names(runner="decode", tuned=True, timed=True)


def test_without_registering_it_the_policy_is_nowhere(make_config):
    """Negative control: the same config names no such kind, and a grid for an unknown kind is refused."""
    assert "alternating" not in family_names()
    with pytest.raises(ConfigError, match="evaluate.grids='alternating' is not valid"):
        make_config("+evaluate.grids={alternating: [2.0, 4.0]}")


def test_a_source_declared_in_one_file_gets_every_stop_the_league_and_the_wall_clock(top_two, make_config, micro_trio,
                                                                                     micro_root, tmp_path):
    """Collection-free evaluation of a training-free source: under the threshold stop its h is chosen on dev over the
    h grid and applied on test, under the goodput stop it decodes untuned, under the survival budget on the batch axis;
    both serving stops are league rows (training-free, against the perfect predictor of their stop) and timed by the
    wall clock."""
    config = collection_free(make_config, micro_trio, micro_root, tmp_path, "evaluate.figures=false")
    kinds = ["top2-h", "top2-goodput", "top2-budget"]
    assert [policy_spec(kind, 0.5).kind for kind in kinds] == kinds
    composed = {kind: family(kind) for kind in kinds}
    assert not set(kinds) & set(FAMILIES)  # nothing registered for them: composed from the source's and stops' traits
    assert all(f.league == "training-free" and not f.bound for f in composed.values())
    assert (composed["top2-h"].perfect, composed["top2-goodput"].perfect) == ("perfect", "perfect-goodput")
    assert composed["top2-h"].tuned and composed["top2-h"].timed and composed["top2-goodput"].timed
    assert composed["top2-budget"].batch_only and not composed["top2-budget"].timed
    results = evaluate(config.evaluate_job())
    table = results.table
    dev = table[(table["family"] == "top2-h") & (table["role"] == "dev")]
    h_grid = list(STOP_TRAITS["h"].grid)  # undeclared for the source: the threshold stop's own grid, chosen on dev
    chosen = dev.loc[dev["chosen_on"] == "dev", "param"]
    assert len(chosen) == 1 and set(dev["param"]) <= set(h_grid) and len(dev) == dev["param"].nunique()
    at = h_grid.index(chosen.item())  # the climb over it stops with the chosen h's neighbours decoded
    assert set(h_grid[max(at - 1, 0) : at + 2]) <= set(dev["param"])
    for kind in ("top2-h", "top2-goodput"):
        held_out = table[(table["family"] == kind) & (table["role"] != "dev")]
        assert len(held_out) and (held_out["generated"] > 0).all() and held_out["speedup_fixed_cost"].notna().all()
    assert "top2-budget" not in set(table["family"])  # a batch decides it: the batch axis decodes it
    assert any(policy.startswith("top2-budget") for policy in results.batch_axis["policy"])
    league = rendered(league_table(table, results.metadata.cost_models["cost"].caption))
    assert "top2-h" in league and "top2-goodput" in league
    assert {"top2-h", "top2-goodput"} <= set(results.wallclock["family"])  # timed at its dev choice


def test_without_registering_it_the_source_is_nowhere(make_config):
    assert "top2-h" not in family_names()
    with pytest.raises(ValueError, match="unknown policy kind 'top2-h'"):
        policy_spec("top2-h")
    with pytest.raises(ConfigError, match="evaluate.grids='top2-h' is not valid"):
        make_config("+evaluate.grids={top2-h: [0.5]}")


def test_a_parameterless_rule_declared_in_one_file_is_labelled_and_trained(argmax_match, make_config, micro_trio,
                                                                              tmp_path):
    common = [*model_overrides(micro_trio), *DATA_OVERRIDES, f"paths.root={tmp_path}",
              "rules.names=[speculative,argmax-match]"]
    collect(make_config(*common).collect_job())
    table = load_split(Path(tmp_path) / "tiny" / "data", "train")
    labels = torch.tensor([x for row in table["label_argmax-match"] for x in row])
    assert labels.numel() > 0 and set(labels.unique().tolist()) <= {0.0, 1.0}
    spec_labels = torch.tensor([x for row in table["label_speculative"] for x in row])
    assert not torch.equal(labels, spec_labels)  # its own labels, not a copy of another rule's
    result = train(make_config(*common, *TRAIN_OVERRIDES, "head.rule=argmax-match").train_job())
    assert Path(result.head_path).is_file()


def test_a_rule_with_a_parameter_declared_in_one_file_is_labelled_trained_and_swept(tempered, make_config, micro_trio,
                                                                                      tmp_path):
    common = [*model_overrides(micro_trio), *DATA_OVERRIDES, f"paths.root={tmp_path}",
              "rules.names=[speculative,tempered]", "+rules.params.tempered={power: 3.0}"]
    collect(make_config(*common).collect_job())
    table = load_split(Path(tmp_path) / "tiny" / "data", "train")
    labels = torch.tensor([x for row in table["label_tempered"] for x in row])
    spec_labels = torch.tensor([x for row in table["label_speculative"] for x in row])
    assert labels.numel() > 0 and not torch.equal(labels, spec_labels)
    assert torch.allclose(labels, spec_labels**3)  # labelled at the configured power, not the declared default

    with pytest.raises(ConfigError, match=r"head.rule=tempered needs labels .*'power': 2.0"):
        train(make_config(*[o for o in common if "power" not in o], *TRAIN_OVERRIDES, "head.rule=tempered")
              .train_job())  # the data holds power 3's labels
    result = train(make_config(*common, *TRAIN_OVERRIDES, "head.rule=tempered", "head.name=tempered").train_job())
    assert result.rule == {"name": "tempered", "params": {"power": 3.0}}  # recorded in the head's metadata

    results = evaluate(make_config(*common, *EVAL_OVERRIDES, "evaluate.rules=[tempered]",
                                   "+evaluate.rule_grids.tempered=[1.0,5.0]", "evaluate.hf.baselines=false",
                                   "evaluate.bounds=false", "evaluate.figures=false").evaluate_job())
    rows = results.table[results.table["rule"] == "tempered"]
    (choice,) = [c for c in results.metadata.selection if c.swept == "rule_param"]
    assert choice.rule == "tempered" and choice.value in (1.0, 3.0, 5.0)  # its power, chosen on dev
    dev = rows[(rows["role"] == "dev") & (rows["family"] == "fixed") & (rows["param"] == choice.param)]
    assert set(dev["rule_param"]) == {1.0, 3.0, 5.0}  # the grid and the configured power, at its chosen K
    assert {1.0, 5.0} - {choice.value} <= set(rows.loc[rows["set"] == "test", "rule_param"])
    assert "tempered" in set(rows.loc[rows["family"] == "head", "artifact"])  # its head decodes with it


def test_a_rule_parameter_is_checked_against_the_rule_at_compose_time(tempered, make_config):
    assert make_config("+rules.params.tempered={power: 3.0}").rules.params["tempered"] == {"power": 3.0}
    with pytest.raises(ConfigError, match="rules.params.tempered: rule 'tempered' has no parameter powr"):
        make_config("+rules.params.tempered={powr: 3.0}")
    with pytest.raises(ConfigError, match="evaluate.rule_grids='argmax-match' is not valid"):
        make_config("+evaluate.rule_grids={argmax-match: [1.0]}")  # no parameter to sweep


def test_without_registering_it_the_rule_is_refused(make_config):
    with pytest.raises(ConfigError, match="rules.names"):
        make_config("rules.names=[speculative,argmax-match]")
    with pytest.raises(ConfigError, match="rules.params='tempered' is not valid"):
        make_config("+rules.params.tempered={power: 3.0}")
