"""Validation loss vs softmax temperature (lm head kernel / T)."""
import os, sys
import jax
from specdec_jax.eval import default_models_eval as dme
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from valloss import load, tok, spec, exs, make  # one loader for both checks
split = os.environ.get("SPLIT", "validation")
rows = dme.tokenize(tok, spec, exs[split])
Ts = [0.8, 1.0, 1.2, 1.4, 1.6, 1.8, 2.0]
for arg in sys.argv[1:]:
  level = arg.split("=")[0]
  model, params = load(arg)
  out = []
  for T in Ts:
    p = jax.tree_util.tree_map_with_path(
        lambda pa, x: x / T if "logits_dense" in jax.tree_util.keystr(pa) else x, params)
    out.append(round(dme.heldout_loss(model, p, rows, make), 4))
  print(split, level, dict(zip(Ts, out)), flush=True)
