"""Greedy alpha (medium>large) and BLEU on the validation split: shipped medium vs the on-policy round's last params."""
import dataclasses, sys, json
import jax, jax.numpy as jnp, numpy as np
sys.path.insert(0, "scripts")
import default_models_plan as plan
from specdec_jax import decoding, train as train_lib
from specdec_jax.eval import default_models as dm, default_models_eval as dme
from specdec_jax.eval import metrics

out, wd, split = sys.argv[1], sys.argv[2], sys.argv[3]
pair = dm.load("t5_codegen", assets=out)
exs = dm.examples("t5_codegen", split)
st = plan.stage("t5_codegen", "medium_onpolicy")
state = train_lib.restore_state(wd, train_lib.init_state(pair.m_params, st.config))
last = jax.tree_util.tree_map(lambda x: jnp.asarray(x).astype(jnp.bfloat16).astype(jnp.float32), jax.device_get(state[0].params))
print("last step", int(state[0].step), flush=True)
res = {}
for name, p in (("shipped", pair.m_params), ("last", last)):
  pr = dataclasses.replace(pair, m_params=p)
  preds, s = dme.decode(pr, decoding.make_method("spec_decode"), exs, drafter="medium", verifier="large")
  tgt, _ = dme.decode(pr, decoding.make_method("target_only"), exs, verifier="medium")
  res[name] = dict(alpha=s["accepted"] / (s["accepted"] + s["rejected"]), acc=s["accepted"] / s["drafted"],
                   bleu=metrics.bleu([e["targets"] for e in exs], tgt))
  print(name, res[name], flush=True)
