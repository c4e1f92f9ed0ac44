#!/bin/bash
# bench_decode of the default T5 pair on the lent GPU (tenth session).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
nvidia-smi -L
timeout "${BUDGET:-190}" python3 scripts/bench_decode.py --pair=default-t5 --out="$OUT/bench_decode_default_t5_h200" --num_prompts=8 --new_tokens=32 --repeats=3 --gammas=3,5 --temperatures=0 --batches=1,8 --cascade_alpha=0.3 2>&1 | tee "$OUT/bench.log"
echo "rc ${PIPESTATUS[0]}" | tee -a "$OUT/bench.log"
