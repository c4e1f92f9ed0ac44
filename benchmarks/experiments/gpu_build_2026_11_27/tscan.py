"""Validation loss vs softmax temperature (lm head kernel / T)."""
import os, sys, json
sys.path.insert(0, "scripts")
import jax, numpy as np
import default_models_plan as plan
import train_default_models as tdm
from specdec_jax.eval import default_models as dm
from specdec_jax.eval import default_models_eval as dme
from specdec_jax.models import model_from_config
from specdec_jax import tokenizer as tokenizer_lib, train as train_lib
B = "benchmarks/build_state/t5_codegen_bundle/t5_codegen"
spec = dm.TASKS["t5_codegen"]
tok = tokenizer_lib.Tokenizer(os.path.join(B, "tokenizer.model"), "t5", extra_ids=0)
exs = json.load(open(os.path.join(B, "examples.json")))
make = dme.batch_maker(spec, tok.eos_id, 0.0)
split = os.environ.get("SPLIT", "validation")
rows = dme.tokenize(tok, spec, exs[split])
Ts = [0.8, 1.0, 1.2, 1.4, 1.6, 1.8, 2.0]
for arg in sys.argv[1:]:
  level, path = arg.split("=")
  if path.endswith(".npz"):
    model = model_from_config(plan.arch("t5_codegen", level, tok))
    params = tdm._load_npz_params(path, model)
  else:
    model, params = tdm.load_saved(path)
  out = []
  for T in Ts:
    p = jax.tree_util.tree_map_with_path(
        lambda pa, x: x / T if "logits_dense" in jax.tree_util.keystr(pa) else x, params)
    out.append(round(dme.heldout_loss(model, p, rows, make), 4))
  print(split, level, dict(zip(Ts, out)), flush=True)
