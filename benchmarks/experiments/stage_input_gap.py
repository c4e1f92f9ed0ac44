"""Input gap of a build stage's parameters (validation examples).

    WORKDIR=/work/dm_work6 OUT=/work/dm_out6 PYTHONPATH=. python \\
        benchmarks/experiments/stage_input_gap.py t5_codegen large large_pretrain [LIMIT] [FILE]

Prints the teacher-forced target loss with the real inputs, with another
example's input (fixed permutation) and their difference (nats per token).
"""
import sys, os, json
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
WORKDIR, OUT = os.environ.get("WORKDIR", "/work/dm_work6"), os.environ.get("OUT", "/work/dm_out6")
from specdec_jax import tokenizer as tokenizer_lib
from specdec_jax.eval import default_models as dm
from specdec_jax.eval import default_models_eval as dme
from specdec_jax.models import model_from_config
import default_models_plan as plan
import train_default_models as tdm
task, level, stage = sys.argv[1], sys.argv[2], sys.argv[3]
limit = int(sys.argv[4]) if len(sys.argv) > 4 else 161
spec = dm.TASKS[task]
tok = tokenizer_lib.Tokenizer(f"{OUT}/{task}/tokenizer.model", spec.family, extra_ids=0)
exs = dm.examples(task, "validation", limit=limit)
rows = dme.tokenize(tok, spec, exs)
perm = np.random.default_rng(0).permutation(len(rows))
model = model_from_config(plan.arch(task, level, tok))
fname = sys.argv[5] if len(sys.argv) > 5 else "best_params.npz"
params = tdm._load_npz_params(f"{WORKDIR}/{task}/{stage}/{fname}", model)
make = dme.batch_maker(spec, tok.eos_id, 0.0)
real = dme.heldout_loss(model, params, rows, make)
shuf = dme.heldout_loss(model, params, [(rows[perm[i]][0], r[1]) for i, r in enumerate(rows)], make)
print(json.dumps({"stage": stage, "n": len(rows), "real": round(real, 4), "shuffled": round(shuf, 4), "gap": round(shuf - real, 4)}))
