"""Every notebook runs top to bottom (nbclient) against a micro evaluation, and is stored without outputs."""

from __future__ import annotations

from pathlib import Path

import pytest

from accept_heads.evaluate import evaluate
from accept_heads.evaluation.results import RESULTS_ENV
from data_gen.collect import collect
from tests.helpers.config import DATA_OVERRIDES, EVAL_OVERRIDES, compose_config, model_overrides
from tests.helpers.evaluation import write_artifacts

nbformat = pytest.importorskip("nbformat", reason="a dev dependency; some GPU images lack it")
NotebookClient = pytest.importorskip("nbclient", reason="a dev dependency; some GPU images lack it").NotebookClient

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


@pytest.fixture(scope="module")
def micro_results(micro_trio, tmp_path_factory) -> Path:
    """A micro evaluation (with collected dev data for the calibration notebook); returns its out_dir."""
    root = tmp_path_factory.mktemp("notebook_run")
    common = [*model_overrides(micro_trio), *DATA_OVERRIDES, f"paths.root={root}"]
    collect(compose_config(*common, "prompts.sizes={train: 2, dev: 2}").collect_job())
    write_artifacts(root / "tiny" / "heads", micro_trio["draft"])
    config = compose_config(*common, *EVAL_OVERRIDES, "evaluate.hf.baselines=false")
    evaluate(config.evaluate_job())
    return Path(config.evaluate.out_dir)


def test_the_expected_notebooks_exist():
    assert {p.stem for p in NOTEBOOKS} == {"pareto", "calibration", "sv_profile", "fsd_se"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebooks_are_stored_without_outputs(path):
    notebook = nbformat.read(path, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code and all(not cell.outputs and cell.execution_count is None for cell in code)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes(path, micro_results, monkeypatch):
    monkeypatch.setenv(RESULTS_ENV, str(micro_results))
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=180, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    images = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs
              if "image/png" in o.get("data", {})]
    assert images, f"{path.name} displayed no figure"
