"""The goodput loss's prices: configured, or this machine's measured cost profile (loss.goodput_prices)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from accept_heads.measure.machine_costs import COSTS_ENV
from accept_heads.train import train
from accept_heads.training.prices import priced_loss
from ahconf.schema import ConfigError
from decode.artifacts.serialization import load_head
from decode.batch_costs import CostProfile


def stored_model(root):
    """The batch-1 eager cost model of the one profile stored under ``root``."""
    (path,) = list(root.rglob("*.json"))
    return CostProfile.from_dict(json.loads(path.read_text())["profile"]).cost_model(False)


def test_measured_prices_are_the_stored_profiles_and_a_head_records_them(make_config, train_overrides, tmp_path,
                                                                         monkeypatch):
    monkeypatch.setenv(COSTS_ENV, str(tmp_path / "costs"))
    data_dir = Path(train_overrides[-1].split("=", 1)[1]) / "tiny" / "data"  # the shared micro data, read only
    goodput = [*train_overrides, f"paths.root={tmp_path}", f"paths.data_dir={data_dir}", "loss.goodput_weight=1",
               "loss.goodput_k=3",
               "decoding.repeats=1", "trainer.max_epochs=1"]
    job = make_config(*goodput, "loss.goodput_prices=measured").train_job()
    loss = priced_loss(job)
    model = stored_model(tmp_path / "costs")
    assert loss.goodput_draft_cost == pytest.approx(model.t_draft / model.t_target)
    assert loss.goodput_verify_shape == pytest.approx(list(model.latency([1, 2, 3])))
    assert loss.goodput_verify_shape[0] == 1.0 and loss.goodput_draft_cost != job.loss.goodput_draft_cost
    assert priced_loss(job) == loss  # read back from the store, not measured again
    result = train(job)
    recorded = load_head(result.head_path).metadata.train_config["loss"]
    assert recorded["goodput_prices"] == "measured"
    assert recorded["goodput_draft_cost"] == pytest.approx(loss.goodput_draft_cost)
    # negative controls: configured prices, and no goodput term, keep the configured numbers and measure nothing
    for extra in ("loss.goodput_prices=configured", "loss.goodput_weight=0"):
        other = make_config(*goodput, "loss.goodput_prices=measured", extra).train_job()
        assert priced_loss(other) == other.loss


def test_an_unknown_price_source_fails_at_compose_time(make_config):
    with pytest.raises(ConfigError, match="goodput_prices"):
        make_config("loss.goodput_prices=guessed")
