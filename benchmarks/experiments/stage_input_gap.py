"""Input use of a build stage's parameters (validation examples).

    WORKDIR=/work/dm_work6 OUT=/work/dm_out6 PYTHONPATH=. python \\
        benchmarks/experiments/stage_input_gap.py t5_codegen large large_pretrain [LIMIT] [FILE]

Prints ``scripts/input_dependence.measure_model`` for the stage's
``FILE`` (default best_params.npz): the teacher-forced target loss with the
real inputs, another example's input and an empty input, and the gap
(shuffled - real, nats per token).
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..",
                                "scripts"))
from specdec_jax import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
from specdec_jax.eval import default_models as dm
from specdec_jax.models import model_from_config
import default_models_plan as plan
import input_dependence
import train_default_models as tdm

WORKDIR = os.environ.get("WORKDIR", "/work/dm_work6")
OUT = os.environ.get("OUT", "/work/dm_out6")
task, level, stage = sys.argv[1:4]
limit = int(sys.argv[4]) if len(sys.argv) > 4 else 161
fname = sys.argv[5] if len(sys.argv) > 5 else "best_params.npz"
spec = dm.TASKS[task]
tok = tokenizer_lib.Tokenizer(os.path.join(OUT, task, dm.TOKENIZER),
                              spec.family, extra_ids=0)
exs = dm.examples(task, "validation", limit=limit)
model = model_from_config(plan.arch(task, level, tok))
params = tdm._load_npz_params(os.path.join(WORKDIR, task, stage, fname), model)  # pylint: disable=protected-access
res = input_dependence.measure_model(model, params, tok, spec, exs)
res = {k: round(v, 4) for k, v in res.items()}
print(json.dumps(dict(stage=stage, n=len(exs), gap=round(
    res["shuffled"] - res["real"], 4), **res)))
