"""Held-out loss (ground truth, teacher forcing) of saved models / stage
params npz: ``[SPLIT=validation,test] python valloss.py LEVEL=PATH ...``."""
import os, sys
sys.path.insert(0, "scripts")
import default_models_bundle as bl
import default_models_plan as plan
import train_default_models as tdm
from specdec_jax.eval import default_models as dm
from specdec_jax.eval import default_models_eval as dme
from specdec_jax.models import model_from_config
from specdec_jax import tokenizer as tokenizer_lib
import json
B = "benchmarks/build_state/t5_codegen_bundle/t5_codegen"
spec = dm.TASKS["t5_codegen"]
tok = tokenizer_lib.Tokenizer(os.path.join(B, "tokenizer.model"), "t5", extra_ids=0)
exs = json.load(open(os.path.join(B, "examples.json")))
val = dme.tokenize(tok, spec, exs["validation"])
make = dme.batch_maker(spec, tok.eos_id, 0.0)


def load(arg):
  """(model, params) of ``LEVEL=PATH`` (a saved model dir or stage npz)."""
  level, path = arg.split("=")
  if path.endswith(".npz"):
    model = model_from_config(plan.arch("t5_codegen", level, tok))
    return model, tdm._load_npz_params(path, model)
  return tdm.load_saved(path)


if __name__ == "__main__":
  splits = {s: val if s == "validation" else dme.tokenize(tok, spec, exs[s])
            for s in os.environ.get("SPLIT", "validation").split(",")}
  for arg in sys.argv[1:]:
    model, params = load(arg)
    print(arg, *(f"{s} {dme.heldout_loss(model, params, rows, make):.4f}"
                 for s, rows in splits.items()), flush=True)
