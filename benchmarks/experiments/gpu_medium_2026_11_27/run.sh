#!/bin/bash
# Tenth session: the teacher's 'more' split and the t5_codegen medium (A: the plan, 3,000 steps; B: 4,500) on the lent GPU.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi -L
python3 -c "import jax, flax, optax; print(jax.__version__, flax.__version__, optax.__version__, jax.devices())" || exit 1
END=$(( $(date +%s) + ${BUDGET:-480} )); left() { echo $(( END - $(date +%s) )); }
W=/tmp/w; O=/tmp/o; W2=/tmp/w2; O2=/tmp/o2
cp -r .devrun/work $W; cp -r .devrun/out $O
T="python3 scripts/train_default_models.py --data .devrun/bundle --pairs t5_codegen --report ''"
timeout $(left) $T --workdir $W --out $O --only teacher > $OUT/a.log 2>&1; echo "teacher rc $? left $(left)" >> $OUT/a.log
mkdir -p $W2/t5_codegen; cp -r $O $O2
for s in large large_distill teacher medium_pretrain; do ln -s $W/t5_codegen/$s $W2/t5_codegen/$s; done
( timeout $(left) $T --workdir $W --out $O --only medium >> $OUT/a.log 2>&1; echo "A rc $? left $(left)" >> $OUT/a.log ) &
sleep 5
( timeout $(( $(left) + 20 )) python3 .devrun/variant_b.py --data .devrun/bundle --pairs t5_codegen --report '' --workdir $W2 --out $O2 --only medium > $OUT/b.log 2>&1; echo "B rc $?" >> $OUT/b.log ) &
wait
nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv
pack() {  # workdir out dest
  mkdir -p $3; cp $1/t5_codegen/medium/*.json $3/ 2>/dev/null
  if [ -d $2/t5_codegen/medium ]; then cp -r $2/t5_codegen/medium $3/model; else cp $1/t5_codegen/medium/best_params.npz $3/ 2>/dev/null; fi
}
pack $W $O /tmp/pa; pack $W2 $O2 /tmp/pb
cp $W/t5_codegen/teacher/more_greedy_outputs.json $W/t5_codegen/teacher/done.json /tmp/pa/ 2>/dev/null || true
tar -C /tmp -czf $OUT/a.tgz pa; tar -C /tmp -czf $OUT/b.tgz pb; ls -la $OUT; du -a /tmp/pa /tmp/pb
