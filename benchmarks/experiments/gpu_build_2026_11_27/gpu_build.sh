#!/bin/bash
# T5 t5_codegen family build on the lent GPU (3 processes sharing a workdir).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi -L
python3 -c "import jax, flax, optax; print(jax.__version__, flax.__version__, optax.__version__, jax.devices())" || exit 1
W=/tmp/w; O=/tmp/o; D=benchmarks/build_state/t5_codegen_bundle
END=$(( $(date +%s) + ${BUDGET:-500} ))
left() { echo $(( END - $(date +%s) )); }
T="python3 scripts/train_default_models.py --data $D --workdir $W --out $O --pairs t5_codegen --report ''"
( timeout $(left) $T > $OUT/a.log 2>&1; echo "a rc $?" >> $OUT/a.log ) &
sleep 2
( timeout $(left) $T --only medium_pretrain > $OUT/b.log 2>&1; echo "b rc $?" >> $OUT/b.log ) &
( timeout $(left) $T --only small_pretrain > $OUT/c.log 2>&1; echo "c rc $?" >> $OUT/c.log
  while [ ! -f $W/t5_codegen/teacher/done.json ] && [ $(left) -gt 5 ]; do sleep 3; done
  [ $(left) -gt 5 ] && timeout $(left) $T --only small >> $OUT/c.log 2>&1; echo "c2 rc $?" >> $OUT/c.log ) &
wait
nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv
python3 benchmarks/experiments/gpu_build_2026_11_27/pack.py $W $O $OUT
