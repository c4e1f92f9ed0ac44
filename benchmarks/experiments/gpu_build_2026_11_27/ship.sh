#!/bin/bash
# Ships a finished t5_codegen build (used 2026-11-27, when the ship patch,
# benchmarks/build_state/ship_t5_codegen.patch, was applied and merged; it
# is gone since): run from the root of a checkout after
# `train_default_models.py --pairs t5_codegen,gemma_completion` (no --data)
# wrote OUT/metadata.json. The 2026-11-27 ship skipped bench_vs_hf (marker
# touched by hand) for lack of session time.
#
#   bash benchmarks/experiments/gpu_build_2026_11_27/ship.sh /work/dm_out6 2>&1 | tee /work/ship.log
#
# Each step is skipped when its marker exists in $MARK (rerun after a
# failure to go on from there). Wall times on the 2-core build machine:
# golden ~2 min, main job ~7 min, bench_decode ~15 min, bench_tree ~20 min,
# bench_hierarchy ~10 min, bench_vs_hf ~15 min, significance ~10 min each.
set -euo pipefail
OUT6=${1:?usage: ship.sh OUT_DIR_OF_THE_BUILD}
PY=${PY:-.venv-test/bin/python}
MARK=${MARK:-/tmp/ship_marks}
export JAX_PLATFORMS=cpu PYTHONPATH=.
mkdir -p "$MARK"
step() {  # step NAME COMMAND...
  local name=$1; shift
  if [ -f "$MARK/$name" ]; then echo "== $name: done before"; return; fi
  echo "== $name: $* ($(date -u +%H:%M:%S))"
  local t0=$SECONDS
  "$@"
  echo "== $name: $((SECONDS - t0)) s"
  touch "$MARK/$name"
}
A=specdec_jax/assets/default_models
copy_assets() {
  [ -f "$OUT6/metadata.json" ] || { echo "no $OUT6/metadata.json: run the eval stage first"; exit 1; }
  git rm -r -q --cached "$A/t5_docstring" 2>/dev/null || true
  rm -rf "$A/t5_docstring" "$A/t5_codegen" "$A/gemma_completion"
  cp -r "$OUT6/t5_codegen" "$OUT6/gemma_completion" "$OUT6/metadata.json" "$A/"
  local mb; mb=$(du -sm "$A" | cut -f1)
  echo "assets: $mb MB"; [ "$mb" -le 60 ] || { echo "assets over 60 MB"; exit 1; }
}
R=benchmarks/results
step assets copy_assets
step families $PY -m pytest -q tests/eval/test_default_families.py tests/eval/test_default_models.py
step golden $PY -m tests.decoding.golden --record_new
step main_job bash -c "rm -rf results/main_job; $PY -m specdec_jax.main main 2>&1 | tee /tmp/main_job_console.log"
copy_main_job() {  # the committed files (results.jsonl is not; see main_job/README.md)
  rm -f $R/main_job/quality_vs_latency_*.png
  cp results/main_job/summary.md results/main_job/summary.json results/main_job/timings.jsonl results/main_job/*.png $R/main_job/
  sed 's/\r/\n/g' /tmp/main_job_console.log | grep -v '%|' > $R/main_job/console.log
}
step main_job_copy copy_main_job
step significance_t5 $PY scripts/family_significance.py --assets $A --pairs t5_codegen --resamples 1000 --predictions /work/ship_preds_t5.json --out $R/default_models_significance_t5
step input_dependence bash -c "$PY scripts/input_dependence.py --assets $A --limit 256 | tee $R/input_dependence_t5_codegen.txt"
step bench_decode $PY scripts/bench_decode.py --pair=default-t5 --out=$R/bench_decode_default_t5 --num_prompts=8 --new_tokens=32 --repeats=5 --gammas=1,3,5,8 --temperatures=0,1 --batches=1,8 --cascade_alpha=0.3
step bench_tree $PY scripts/bench_tree.py --pairs=default-t5 --out=$R/bench_tree_default_t5 --nodes=8,16,32 --kary=2,4 --gammas=3,5,7 --temperatures=0,1 --batches=1,8 --repeats=2 --num_prompts=8 --new_tokens=32
step bench_hierarchy $PY scripts/bench_hierarchy.py --stacks=default-gemma,default-t5,random-gemma --repeats=3 --new_tokens=48 --out=$R/bench_hierarchy
step bench_vs_hf $PY scripts/bench_vs_hf.py --out $R/bench_vs_hf --num_prompts 8 --repeats 3 --ours_pad pow2 --sweep_gammas 3
echo "shipped; now: README tables, docs/default_models.md status, the report, snapshot, .ci/run"
