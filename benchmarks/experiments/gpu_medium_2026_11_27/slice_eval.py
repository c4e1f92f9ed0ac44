"""Slice (first 64 test examples) evaluation and held-out losses of candidate mediums."""
import dataclasses, json, sys
sys.path.insert(0, "scripts")
import default_models_plan as plan
from specdec_jax.checkpoints import native
from specdec_jax.eval import default_models as dm
from specdec_jax.eval import default_models_eval as dme

out = sys.argv[1]
pair = dm.load("t5_codegen", assets=out)
exs = dm.examples("t5_codegen", "test", limit=plan.SLICE_EXAMPLES)
tok, spec = pair.tokenizer, pair.spec
make = dme.batch_maker(spec, tok.eos_id, 0.0)
val = dme.tokenize(tok, spec, dm.examples("t5_codegen", "validation"))
test = dme.tokenize(tok, spec, dm.examples("t5_codegen", "test"))
for path in sys.argv[2:]:
  pr = pair
  if path != "shipped":
    m, p = native.load(path, dtype="float32")
    pr = dataclasses.replace(pair, medium=m, m_params=p)
  ev = dme.evaluate_family(pr, exs, batch_size=plan.SLICE_EXAMPLES)
  mm, mp = pr.model("medium")
  print(path, json.dumps(dict(
      slice_metric={lv: ev["levels"][lv]["bleu"] for lv in dm.LEVELS},
      slice_loss={lv: ev["levels"][lv]["loss"] for lv in dm.LEVELS},
      slice_alpha=ev["alpha"], slice_loops={lv: ev["levels"][lv]["repetition_loop_fraction"] for lv in dm.LEVELS},
      medium_val_loss=dme.heldout_loss(mm, mp, val, make),
      medium_test_loss=dme.heldout_loss(mm, mp, test, make))), flush=True)
