"""No deprecated transformers API on a user's path: a short pipeline, FutureWarning and DeprecationWarning as errors.

collect → train a head → evaluate (our decoder, HF assisted generation, the wall clock) → the decoding
benchmark, all on the micro trio. transformers signals a deprecated argument with a FutureWarning
(e.g. ``past_key_values`` renamed ``cache``) or a DeprecationWarning; either one fails this test. Only
one library's deprecation of another's use of it is let through, as the entry points do
(:data:`ahconf.entry.OTHER_LIBRARIES_DEPRECATIONS`).
"""

from __future__ import annotations

import warnings

from accept_heads.evaluate import evaluate
from accept_heads.train import train
from ahconf.entry import OTHER_LIBRARIES_DEPRECATIONS
from benchmarks.decoding import main as benchmark_decoding
from data_gen.collect import collect
from tests.helpers.config import DATA_OVERRIDES, TRAIN_OVERRIDES, model_overrides

EVALUATION = [
    "evaluate.rules=[speculative]",
    "decoding.prompts={dev: 2, test: 2, ood: 2}",
    "decoding.max_new_tokens=8",
    "+evaluate.grids.fixed=[1,3]",
    "+evaluate.grids.confidence=[0.4]",
    "evaluate.calibration_rows=2",
    "evaluate.latency.lengths=3",
    "decoding.repeats=1",
    "evaluate.workers=1",
    "evaluate.wallclock.sets=[test]",
    "evaluate.wallclock.rules=[speculative]",
    "evaluate.wallclock.threads=1",
    "cost.t_companion=null",
]


def test_a_short_pipeline_uses_no_deprecated_transformers_api(make_config, micro_trio, tmp_path, capsys):
    overrides = [*model_overrides(micro_trio), *DATA_OVERRIDES, *TRAIN_OVERRIDES, f"paths.root={tmp_path}"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        warnings.simplefilter("error", DeprecationWarning)
        for message in OTHER_LIBRARIES_DEPRECATIONS:
            warnings.filterwarnings("ignore", message=message, category=FutureWarning)
        collect(make_config(*overrides).collect_job())
        head = train(make_config(*overrides, "head.name=speculative-pre").train_job())
        results = evaluate(make_config(*overrides, *EVALUATION).evaluate_job())
        rows = benchmark_decoding(["--target", str(micro_trio["target"]), "--draft", str(micro_trio["draft"]),
                                   "--k", "2", "--prompts", "2", "--max-new-tokens", "8", "--threads", "1"])
    assert head.head_path.endswith("head.safetensors")
    assert {"fixed", "head", "hf-constant"} <= set(results.table["family"])
    assert len(results.wallclock) > 0
    assert [row.tokens for row in rows] == [16, 16, 16]  # every method decoded 2 prompts x 8 tokens
    assert "deprecat" not in capsys.readouterr().err.lower()
