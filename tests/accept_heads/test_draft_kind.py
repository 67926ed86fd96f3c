"""A draft kind declared in this file alone is collected, trained and evaluated (:mod:`decode.drafts`).

The toy kind is a micro Llama of its own config class whose drafter says its ``q`` depends on the depth in a round
(so collection labels, and its heads read, every depth; its round states are its teacher-forced states at each
depth, which for a draft of tokens alone are equal), that its first step in a row is the target's alone, and that
transformers' assistant loop cannot run it. No other file names it: the registry is
:data:`decode.drafts.DRAFTERS`, keyed by its config class; the fixture registers it for one test, as
``@register_drafter`` would where it is defined.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, PreTrainedModel

from accept_heads.evaluate import evaluate
from accept_heads.measure.families import FAMILIES
from accept_heads.train import train
from data_gen.collect import collect
from data_gen.shards import load_split
from decode.artifacts.threshold_choice import matching_choice
from decode.drafts import DRAFTERS, Drafter, DraftFeed, PlainDrafter, drafter_of, register_drafter
from tests.helpers.config import DATA_OVERRIDES, EVAL_OVERRIDES, TRAIN_OVERRIDES, model_overrides

HF_FAMILIES = {name for name, family in FAMILIES.items() if family.runner == "hf"}


class ToyConfig(LlamaConfig):
    model_type = "toy_round_draft"


class ToyForCausalLM(LlamaForCausalLM):
    config_class = ToyConfig


class FirstStepAlone:
    """The draft's runner, not ready for a row until the target has verified one round of it; counts its feeds."""

    def __init__(self, inner: Any, log: dict[str, int]) -> None:
        self.inner, self.log, self.started = inner, log, set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def ready(self, row: int) -> bool:
        first = row not in self.started
        self.started.add(row)
        self.log["held"] += first
        return not first

    def feed(self, tokens: Tensor, ends: dict[int, int], keep: int) -> dict[int, Tensor]:
        self.log["feeds"] += 1
        return self.inner.feed(tokens, ends, keep)


class ToyDrafter(Drafter):
    name = "toy"
    config_class = ToyConfig
    depth_dependent = True
    assisted_generation = False
    log: dict[str, int] = {}

    def feed(self, draft: PreTrainedModel, rows: int, length: int) -> DraftFeed:
        return DraftFeed(wrap=lambda inner: FirstStepAlone(inner, self.log))

    def round_states(self, target: PreTrainedModel | None, draft: PreTrainedModel, input_ids: Tensor,
                     attention_mask: Tensor, depths: int) -> list[Tensor]:
        self.log["rounds"] += 1
        positions = (attention_mask.cumsum(-1) - 1).clamp_min(0)
        states = draft.get_decoder()(input_ids=input_ids, attention_mask=attention_mask,
                                     position_ids=positions).last_hidden_state
        return [states] * depths


@pytest.fixture()
def toy_draft(micro_trio: dict[str, Path], tmp_path: Path) -> Iterator[Path]:
    """The micro draft saved as the toy kind, its config and model registered with the Auto classes and its drafter
    in the registry for this test."""
    AutoConfig.register(ToyConfig.model_type, ToyConfig, exist_ok=True)
    AutoModelForCausalLM.register(ToyConfig, ToyForCausalLM, exist_ok=True)
    plain = LlamaForCausalLM.from_pretrained(micro_trio["draft"])
    toy = ToyForCausalLM(ToyConfig(**plain.config.to_dict()))
    toy.load_state_dict(plain.state_dict())
    path = tmp_path / "toy_draft"
    toy.save_pretrained(path)
    for name in Path(micro_trio["draft"]).iterdir():
        if "token" in name.name:
            (path / name.name).write_bytes(name.read_bytes())
    ToyDrafter.log = {"feeds": 0, "held": 0, "rounds": 0}
    register_drafter(ToyDrafter)
    yield path
    del DRAFTERS[ToyConfig]


def test_a_draft_kind_declared_in_one_file_is_collected_trained_and_evaluated(toy_draft, make_config, micro_trio,
                                                                              tmp_path):
    log = ToyDrafter.log
    common = [*model_overrides(micro_trio), f"models.draft.id={toy_draft}", *DATA_OVERRIDES, f"paths.root={tmp_path}",
              "collect.depths=2"]
    collect(make_config(*common).collect_job())
    table = load_split(Path(tmp_path) / "tiny" / "data", "train")
    assert log["rounds"] > 0 and "label_speculative@d2" in table.column_names  # its rounds labelled at depth 2
    deep = torch.tensor([x for row in table["label_speculative@d2"] for x in row])
    assert deep.isnan().any() and not deep.isnan().all()  # a round never starts in the prompt

    labelled = log["rounds"]
    result = train(make_config(*common, *TRAIN_OVERRIDES, "head.mixing_r=1").train_job())
    assert Path(result.head_path).is_file() and log["rounds"] > labelled  # the head read its rounds
    assert log["feeds"] == 0  # training decodes nothing: the evaluation chooses h

    results = evaluate(make_config(*common, *EVAL_OVERRIDES, "evaluate.rules=[speculative]", "evaluate.bounds=false",
                                   "evaluate.figures=false").evaluate_job())
    rows = results.table
    assert log["feeds"] > 0 and log["held"] > 0  # decoded through its runner, each row's first step held
    assert "head" in set(rows["family"]) and not rows["family"].isin(HF_FAMILIES).any()
    assert matching_choice(Path(result.head_path)) is not None  # its h chosen by that evaluation
    assert "cannot run a toy draft" in results.metadata.notes["hf_baselines"]


def test_without_registering_it_the_kind_is_a_plain_draft(micro_trio):
    assert ToyConfig not in DRAFTERS
    assert isinstance(drafter_of(ToyConfig(**LlamaConfig().to_dict())), PlainDrafter)
