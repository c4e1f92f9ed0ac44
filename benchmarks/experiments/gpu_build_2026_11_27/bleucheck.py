"""Greedy validation check (train_default_models.check_large) of saved
models / npz params; ``EXAMPLES=N`` checks the first N validation examples
instead of ``plan.CHECK_EXAMPLES`` (``EXAMPLES=all``: the whole split)."""
import os, sys, json, types, tempfile
sys.path.insert(0, "scripts")
import default_models_plan as plan, train_default_models as tdm
if os.environ.get("EXAMPLES"):
  n = os.environ["EXAMPLES"]
  plan.CHECK_EXAMPLES = None if n == "all" else int(n)  # exs[:None]: all
from specdec_jax.eval import default_models as dm
from specdec_jax.models import model_from_config
from specdec_jax import tokenizer as tokenizer_lib
B = "benchmarks/build_state/t5_codegen_bundle/t5_codegen"
spec = dm.TASKS["t5_codegen"]
tok = tokenizer_lib.Tokenizer(os.path.join(B, "tokenizer.model"), "t5", extra_ids=0)
exs = json.load(open(os.path.join(B, "examples.json")))
fam = types.SimpleNamespace(task="t5_codegen", tok=tok, spec=spec, examples=exs)
for arg in sys.argv[1:]:
  level, path = arg.split("=")
  if path.endswith(".npz"):
    model = model_from_config(plan.arch("t5_codegen", level, tok))
    params = tdm._load_npz_params(path, model)
    path = tempfile.mkdtemp()
    tdm.save_model(path, model, params)
  print(level, arg, tdm.check_large(fam, path), flush=True)
