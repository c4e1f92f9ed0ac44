#!/bin/bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
cp -r .devrun/state/w /tmp/w; cp -r .devrun/state/o /tmp/o  # the returned state, carried
timeout ${BUDGET:-200} python3 scripts/train_default_models.py --data benchmarks/build_state/t5_codegen_bundle --workdir /tmp/w --out /tmp/o --pairs t5_codegen --report '' --only teacher > $OUT/t.log 2>&1; echo "t rc $?" >> $OUT/t.log
python3 benchmarks/experiments/gpu_build_2026_11_27/pack.py /tmp/w/t5_codegen/teacher /nonexistent $OUT
