#!/usr/bin/env bash
# Runs scripts/bench_decode.py on two checkouts of specdec_jax, one after the
# other per pair (before, after), with the same settings and the same default
# models, then writes a side-by-side comparison (scripts/compare_bench_decode.py).
#
#   bash scripts/bench_before_after.sh BEFORE_DIR AFTER_DIR OUT_DIR [PAIRS]
#
# BEFORE_DIR / AFTER_DIR: work trees (git worktree add ...) of the two commits;
# both must hold the same default-model assets. PAIRS defaults to
# "random-gemma default-t5 default-gemma". Uses this checkout's .venv-test
# (or $PYTHON). Every run's JSON/Markdown lands in OUT_DIR as
# {before,after}_<pair>.{json,md}; the comparison in OUT_DIR/README.md.
set -euo pipefail
BEFORE=$(realpath "${1:?before work tree}")
AFTER=$(realpath "${2:?after work tree}")
OUT=$(realpath -m "${3:?output directory}")
PAIRS=${4:-"random-gemma default-t5 default-gemma"}
HERE=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-$HERE/.venv-test/bin/python}
export JAX_PLATFORMS=cpu TF_CPP_MIN_LOG_LEVEL=2
mkdir -p "$OUT"
# shellcheck disable=SC2054  # the commas are inside flag values
FLAGS=(--num_prompts=8 --new_tokens=32 --repeats=5 --gammas=1,3,5,8
       --temperatures=0,1 --batches=1,8 --cascade_alpha=0.3)
# BENCH_DECODE_FLAGS (space-separated) replaces the flags above.
if [ -n "${BENCH_DECODE_FLAGS:-}" ]; then
  read -r -a FLAGS <<< "$BENCH_DECODE_FLAGS"
fi
for pair in $PAIRS; do
  name=${pair//-/_}
  for side in before after; do
    dir=$BEFORE
    [ "$side" = after ] && dir=$AFTER
    echo "== $side $pair ($(git -C "$dir" rev-parse --short HEAD))"
    (cd "$dir" && PYTHONPATH="$dir" "$PYTHON" scripts/bench_decode.py \
        --pair="$pair" --out="$OUT/${side}_$name" "${FLAGS[@]}")
  done
done
{
  echo "# bench_decode before and after"
  echo
  echo "Before: \`$(git -C "$BEFORE" log --oneline -1)\`; after:" \
       "\`$(git -C "$AFTER" log --oneline -1)\`."
  echo "Command: \`BENCH_DECODE_FLAGS='${FLAGS[*]}' bash scripts/bench_before_after.sh $BEFORE $AFTER $OUT '$PAIRS'\`"
  echo "(each pair: the before run, then the after run; bench_decode flags:"
  echo "\`${FLAGS[*]}\`)."
  echo
  for pair in $PAIRS; do
    name=${pair//-/_}
    "$PYTHON" "$HERE/scripts/compare_bench_decode.py" \
        --before "$OUT/before_$name.json" --after "$OUT/after_$name.json" \
        --title "$pair"
  done
} > "$OUT/README.md"
echo "wrote $OUT/README.md"
