#!/usr/bin/env bash
# Accelerator benchmark of issue 39 (GPU timings when a device is lent).
#
#   bash scripts/device_bench.sh                 # on the device: OUT is set
#   OUT=/tmp/db SMOKE=1 bash scripts/device_bench.sh   # plumbing check, CPU
#
# Runs from a normal checkout (no build step; PYTHONPATH=.). On the memory-
# bound random bfloat16 pair `random-gemma1b` (1.02B-parameter verifier, its
# first 2 layers as an early-exit drafter; scripts/bench_decode.py
# RANDOM_GEMMA), batch 1 and 8, greedy:
#   1. bench_decode: b (block cost), c (drafter cost), measured speedup vs
#      Leviathan et al.'s theory (goal: measured / theory >= 0.85 at batch 1);
#   2. bench_overhead: per-call / per-iteration split, model vs non-model;
#   3. bench_auto: what `tune` picks vs target-only vs every candidate;
# then, if time is left, bench_decode on `random-gemma2b` (Gemma 2 2B's
# shape, 2.61B). Each step has its own time limit (the whole: <= 8 minutes);
# a step that fails or runs out of time is reported in the results file and
# the next one runs. Writes $OUT/device_bench.md (everything in one file)
# plus each step's .json.
set -u -o pipefail
OUT=${OUT:-/tmp/device_bench}
W=$(mktemp -d)  # logs and per-step .md (the device returns <= 8 files)
mkdir -p "$OUT"
cd "$(dirname "$0")/.." || exit 1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
PAIR=random-gemma1b PAIR2=random-gemma2b NEW=64 SHORT=16 REP=3 LIM=150
if [ "${SMOKE:-0}" = 1 ]; then  # CPU plumbing check on the 37.8M pair
  PAIR=random-gemma PAIR2=random-gemma NEW=8 SHORT=2 REP=1 LIM=900
fi
REPORT=$OUT/device_bench.md
{
  echo "# device_bench ($(date -u +%FT%TZ))"
  echo
  echo "Command: \`bash scripts/device_bench.sh\` (SMOKE=${SMOKE:-0})"
  echo
  echo '```'
  (nvidia-smi -L 2>/dev/null || echo "no nvidia-smi")
  "$PY" -c "import jax, jaxlib; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__, jax.devices())"
  echo '```'
} > "$REPORT" 2>&1

step() {  # step NAME SECONDS CMD...: runs CMD, appends its .md or the error
  local name=$1 secs=$2; shift 2
  local t0=$SECONDS
  echo "== $name" >&2
  timeout "$secs" "$@" > "$W/$name.log" 2>&1
  local rc=$?
  cp "$W/$name.json" "$OUT/" 2>/dev/null
  if [ $rc = 0 ]; then
    { echo; cat "$W/$name.md"; } >> "$REPORT"
  else
    { echo; echo "## $name: FAILED or out of time (exit $rc, ${secs}s limit)";
      echo '```'; tail -20 "$W/$name.log"; echo '```'; } >> "$REPORT"
  fi
  echo "$name: $((SECONDS - t0)) s" >> "$REPORT"
}

step bench_decode "$LIM" "$PY" scripts/bench_decode.py --pair "$PAIR" \
  --gammas 3,5 --batches 1,8 --temperatures 0 --new_tokens "$NEW" \
  --num_prompts 8 --repeats "$REP" --out "$W/bench_decode"
step overhead "$LIM" "$PY" scripts/bench_overhead.py --pairs "$PAIR" \
  --structures target,drafter,chain3,chain5,tree2x3 --batches 1,8 \
  --temperatures 0 --new_tokens "$NEW" --short_tokens "$SHORT" --repeats "$REP" \
  --out "$W/overhead"
step bench_auto "$LIM" "$PY" scripts/bench_auto.py --pairs "$PAIR" --batches 1,8 \
  --temperatures 0 --gammas 2,3,4,5,6 --calib_prompts 4 --num_prompts 8 \
  --new_tokens 32 --repeats "$REP" --no_hierarchy --out "$W/bench_auto"
if [ "${SMOKE:-0}" != 1 ]; then
  step bench_decode_2b 90 "$PY" scripts/bench_decode.py --pair "$PAIR2" \
    --gammas 3 --batches 1 --temperatures 0 --new_tokens "$NEW" \
    --num_prompts 4 --repeats "$REP" --out "$W/bench_decode_2b"
fi
echo "wrote $REPORT"
