"""Every experiment composes against the structured schema; typos fail at compose time."""

from __future__ import annotations

import pickle
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from accept_heads.evaluation.evaluation_plan import plan_evaluation
from accept_heads.evaluation.plan import sweep
from accept_heads.measure.inputs import Artifacts
from ahconf.entry import CONF_DIR, to_config
from ahconf.schema import DEFAULT_MIXING_R, Config, ConfigError
from decode import AcceptanceHead, HeadConfig, rules
from decode.metadata import HeadMetadata
from decode.sampling import Sampling

EXPERIMENTS = sorted(p.stem for p in (Path(CONF_DIR) / "exp").glob("*.yaml"))


def _compose(*overrides: str):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def test_the_expected_experiments_exist():
    assert {"tiny", "llama70b", "gemma27b", "qwen72b_sv", "llama8b_cd"} <= set(EXPERIMENTS)


@pytest.mark.parametrize("exp", EXPERIMENTS)
def test_every_experiment_composes_and_validates(exp):
    config = to_config(_compose(f"+exp={exp}"))
    assert isinstance(config, Config)
    assert config.exp_name == exp


@pytest.mark.parametrize("exp", EXPERIMENTS)
def test_experiment_files_are_global_packages_holding_differences(exp):
    text = (Path(CONF_DIR) / "exp" / f"{exp}.yaml").read_text()
    assert text.startswith("# @package _global_")


def test_paper_experiment_uses_real_hub_ids_and_reference_hyperparameters():
    config = to_config(_compose("+exp=llama70b"))
    assert config.models.target.id == "meta-llama/Llama-2-70b-chat-hf"
    assert config.models.draft.id == "meta-llama/Llama-2-7b-chat-hf"
    assert config.models.target.dtype == "bfloat16"
    assert config.prompts.sizes == {"train": 40000, "dev": 10000, "test": 2000}
    assert set(config.prompts.ood) == {"humaneval", "gsm8k"}
    assert (config.head.depth, config.loss.w_rej, config.head.mixing_r, config.head.k_max) == (3, 6.0, 0.15, 20)


def test_sv_and_ensemble_experiments():
    sv = to_config(_compose("+exp=qwen72b_sv"))
    assert sv.head.kind == "sv_profile" and sv.models.companion is not None
    assert sv.models.companion.id == "Qwen/Qwen2.5-1.5B-Instruct"
    assert sv.cost.t_companion is None  # priced at the call ratio measured on the serving device
    cd = to_config(_compose("+exp=llama8b_cd"))
    ensemble = cd.rules.params["ensemble"]
    assert ensemble["kind"] == "contrastive" and ensemble["mu"] == pytest.approx(0.1)


def test_default_is_the_embedded_tiny_trio():
    config = to_config(_compose())
    assert config.models.target.id.startswith("zoo:")
    assert config.prompts.source == "builtin"
    assert config.cost.t_companion == pytest.approx(0.0236 * 1.17, abs=1e-4)  # configured: the same on every CPU
    assert config.decoding.prompts == {"dev": 40, "test": 80, "ood": 40} and config.decoding.max_new_tokens == 96


@pytest.mark.parametrize("exp, source", [("smollm2", "measured"), ("tiny", "configured"), ("llama70b", "configured"),
                                         ("qwen72b_sv", "configured"), (None, "configured")])
def test_the_real_pair_is_modelled_at_measured_costs_the_paper_configs_and_the_trio_at_the_pair(exp, source):
    config = to_config(_compose(*([f"+exp={exp}"] if exp else [])))
    assert config.cost.source == source
    assert config.evaluate_job().cost.source == source


def test_a_typo_in_the_cost_source_fails_when_the_config_is_built():
    with pytest.raises(ConfigError, match="cost.source='mesured' is not valid; choose one of configured, measured"):
        to_config(_compose("+exp=smollm2", "cost.source=mesured"))


@pytest.mark.parametrize("exp, grid", [("tiny", [0.3, 0.5, 0.7, 0.85, 0.95]), ("smollm2", [0.5, 0.7, 0.85]),
                                       ("llama70b", [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9])])
def test_an_experiments_h_grid_is_the_h_stops_unless_evaluate_grids_overrides_it(exp, grid):
    """The ``h`` stop declares the one ``h`` grid the evaluation decodes the heads and the perfect predictor at on dev
    (the experiments set theirs as ``evaluate.grids``); ``evaluate.grids.<kind>`` overrides it for that kind alone."""
    head = AcceptanceHead(HeadConfig(hidden_size=8))
    head.metadata = HeadMetadata(draft="draft", tokenizer_hash="x", rule=rules.Speculative().spec(),
                                 sampling=Sampling(), head_config=head.config)

    def swept(*overrides: str) -> dict[str, list[float]]:
        job = to_config(_compose(f"+exp={exp}", "dry_run=true", *overrides)).evaluate_job()
        specs = sweep(job, plan_evaluation(job), Artifacts(heads={"pre": head}), "dev", "speculative")
        return {kind: [s.param for s in specs if s.family == kind] for kind in ("head", "perfect")}

    assert swept() == {"head": grid, "perfect": grid}
    assert swept("++evaluate.grids.head=[0.45]") == {"head": [0.45], "perfect": grid}


@pytest.mark.parametrize("old", ["head.thresholds=[0.5]", "evaluate.thresholds=[0.5]", "head.calibrate=false"])
def test_training_chooses_no_h_so_its_old_keys_fail_at_compose_time(old):
    """``h`` is chosen by the evaluation over its grid (``evaluate.grids``); the keys that set it elsewhere are gone."""
    with pytest.raises(ConfigCompositionException) as excinfo:
        _compose(old)
    assert old.split("=")[0].rsplit(".", 1)[1] in str(excinfo.value.__cause__ or excinfo.value)
    # training reads no evaluation setting (the decoding group only prices a goodput loss at measured costs)
    assert {f.name for f in fields(to_config(_compose()).train_job())}.isdisjoint({"cost", "wallclock", "evaluate",
                                                                                  "prompts"})


@pytest.mark.parametrize("override", ["evaluate.wallclock.setz=[test]", "evaluate.batch_axis.size=[1]",
                                      "evaluate.latency.repeat=2", "evaluate.hf.baseline=false"])
def test_a_typo_in_a_nested_evaluate_name_fails_at_compose_time_naming_it(override):
    with pytest.raises(ConfigCompositionException) as excinfo:
        _compose(override)
    assert override.split("=")[0].rsplit(".", 1)[1] in str(excinfo.value.__cause__ or excinfo.value)


@pytest.mark.parametrize("old, new", [("evaluate.max_new_tokens=8", "decoding.max_new_tokens=8"),
                                      ("evaluate.latency.repeats=2", "decoding.repeats=2")])
def test_the_decoding_settings_live_under_decoding_alone(old, new):
    """How the stages decode is ``decoding.*``; the key it had under ``evaluate`` fails as any unknown key does."""
    with pytest.raises(ConfigCompositionException) as excinfo:
        _compose(old)
    assert old.split("=")[0].rsplit(".", 1)[1] in str(excinfo.value.__cause__ or excinfo.value)
    config = to_config(_compose(new))
    key, value = new.removeprefix("decoding.").split("=")
    assert getattr(config.decoding, key) == int(value)
    assert config.evaluate_job().decoding is config.structure_job().decoding


@pytest.mark.parametrize("head", ["specdecpp", "dspark", "sv_profile"])
def test_mixing_r_has_one_default(head):
    assert to_config(_compose(f"head={head}")).head.mixing_r == DEFAULT_MIXING_R
    groups = [p for p in Path(CONF_DIR).glob("*/*.yaml") if p.parent.name != "exp"]
    assert groups and not [p.name for p in groups if "mixing_r" in p.read_text()]  # the schema's, nowhere else
    assert to_config(_compose("+exp=llama70b")).head.mixing_r == 0.15  # negative control: the paper's recipe sets r


def test_typo_in_key_fails_at_compose_time_naming_the_key():
    with pytest.raises(ConfigCompositionException) as excinfo:
        _compose("+exp=tiny", "trainer.max_stepz=1")
    assert "max_stepz" in str(excinfo.value.__cause__ or excinfo.value)


def test_typo_in_a_yaml_group_file_fails(tmp_path):
    bad_conf = tmp_path / "conf"
    import shutil

    shutil.copytree(CONF_DIR, bad_conf)
    (bad_conf / "exp" / "typo.yaml").write_text("# @package _global_\nhead:\n  dpeth: 3\n")
    with initialize_config_dir(config_dir=str(bad_conf), version_base="1.3"):
        with pytest.raises(ConfigCompositionException, match="dpeth"):
            compose(config_name="config", overrides=["+exp=typo"])


@pytest.mark.parametrize(
    "override, key",
    [("head.timing=middle", "head.timing"), ("rules.names=[exact]", "rules.names"), ("sampling.temperature=-1", "temperature"),
     ("head.timing=post", "head.mixing_r=1 leaves none"),
     ("evaluate.batch_axis.rules=[exact]", "evaluate.batch_axis.rules"),
     ("evaluate.batch_axis.sizes=[0,8]", "evaluate.batch_axis.sizes"), ("+evaluate.grids.head=[]", "evaluate.grids.head"),
     ("evaluate.hf.sets=[dev]", "evaluate.hf.sets"),
     ("evaluate.wallclock.prompts=0", "evaluate.wallclock.prompts"), ("decoding.repeats=0", "decoding.repeats"),
     ("decoding.prompts.dev=0", "decoding.prompts"), ("structure.rules=[exact]", "structure.rules")],  # the tiny recipe's r = 1 suits pre heads only
)
def test_invalid_values_fail_validation_naming_the_key(override, key):
    with pytest.raises(ConfigError, match=key):
        to_config(_compose(override))


@pytest.mark.parametrize("override, message", [("prompts.source=alpacca", "unknown prompt source"),
                                               ("prompts.style=poem", "no style 'poem'")])
def test_dry_run_rejects_unknown_prompt_choices(override, message, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "data_gen.collect", override, "dry_run=true", f"paths.root={tmp_path}"],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2
    assert message in result.stderr


def test_wrong_type_fails_at_compose_time():
    with pytest.raises(ConfigCompositionException, match="depth"):
        _compose("head.depth=three")


@pytest.mark.parametrize("module", ["data_gen.collect", "accept_heads.train"])
@pytest.mark.parametrize("exp", ["tiny", "llama70b"])
def test_dry_run_prints_resolved_config_and_loads_nothing(module, exp, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", module, f"+exp={exp}", "dry_run=true", f"paths.root={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    printed = OmegaConf.create(result.stdout.rsplit("\n[", 1)[0])
    assert printed.exp_name == exp
    assert printed.paths.run_dir == f"{tmp_path}/{exp}"  # interpolations resolved
    assert "dry run" in result.stdout


def test_cli_typo_exits_nonzero_naming_the_key(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "accept_heads.train", "+exp=tiny", "trainer.max_stepz=1", f"paths.root={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "max_stepz" in result.stderr


def test_each_stage_job_holds_the_root_configs_groups_and_pickles():
    config = Config()
    for job in (config.collect_job(), config.train_job(), config.evaluate_job(), config.structure_job()):
        for field in fields(job):
            assert getattr(job, field.name) is getattr(config, field.name)
        assert pickle.loads(pickle.dumps(job)) == job  # the evaluation's workers are spawned with it


def test_the_entry_points_drop_lightnings_advertisement_and_keep_its_other_lines():
    import logging

    from ahconf.entry import quiet_library_output

    quiet_library_output()
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    tip = logger.makeRecord(logger.name, logging.INFO, __file__, 0, "💡 Tip: try our cloud logger", (), None)
    info = logger.makeRecord(logger.name, logging.INFO, __file__, 0, "GPU available: False", (), None)
    assert not logger.filter(tip) and logger.filter(info)


def test_the_entry_points_print_the_graph_stores_notices_on_one_line_and_other_warnings_as_before(capsys,
                                                                                                   monkeypatch):
    import warnings

    from ahconf.entry import one_line_notices
    from decode.compile.store import CompiledStoreNotice

    passed_on = []
    monkeypatch.setattr(warnings, "showwarning", lambda message, category, *rest, **kw: passed_on.append(category))
    one_line_notices()
    one_line_notices()  # installed once, not wrapped twice
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("graphs built in /cache (once per machine)", CompiledStoreNotice, stacklevel=1)
        warnings.warn("another library's warning", UserWarning, stacklevel=1)
    assert capsys.readouterr().err == "note: graphs built in /cache (once per machine)\n"
    assert passed_on == [UserWarning]  # negative control: any other warning goes where it went before
