"""Experiment: T5 medium_pretrain with the query kernel's Adam updates scaled.

AdamW's update size does not depend on a parameter's scale, so folding T5's
missing 1/sqrt(head_dim) logit scaling into the query kernel's *init* (as
t5x/HF do; they train with Adafactor, whose updates scale with the
parameter's RMS) leaves the query learning sqrt(head_dim) times faster
relative to its size than a scaled-attention model's. Scale its updates by
QMULT and compare eval losses with the build's medium_pretrain at equal steps:

    QMULT=0.125 PYTHONPATH=. python benchmarks/experiments/t5_query_lr.py \\
        --data benchmarks/build_state/t5_codegen_bundle --workdir /work/exp_q \\
        --out /work/exp_q_out --pairs t5_codegen --only medium_pretrain --report ""
"""
import os, sys
import jax, optax
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
QMULT = float(os.environ.get("QMULT", "0.125"))
from specdec_jax import train as train_lib
import train_default_models as tdm

_orig = train_lib.make_optimizer

def scale_query(m):
  def init(params):
    return optax.EmptyState()
  def update(updates, state, params=None):
    def f(path, u):
      names = [getattr(k, "key", str(k)) for k in path]
      return u * m if "query" in names else u
    return jax.tree_util.tree_map_with_path(f, updates), state
  return optax.GradientTransformation(init, update)

def make_optimizer(cfg):
  return optax.chain(_orig(cfg), scale_query(QMULT))

train_lib.make_optimizer = make_optimizer
sys.argv = [sys.argv[0]] + sys.argv[1:]
tdm.main()
