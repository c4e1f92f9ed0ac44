"""Validation greedy alpha (medium>large) of medium params from .npz files."""
import dataclasses, sys
import jax, jax.numpy as jnp
sys.path.insert(0, "scripts")
import train_default_models as tdm
from specdec_jax import decoding
from specdec_jax.eval import default_models as dm
from specdec_jax.eval import default_models_eval as dme
from specdec_jax.eval import metrics

out, split = sys.argv[1], sys.argv[2]
pair = dm.load("t5_codegen", assets=out)
exs = dm.examples("t5_codegen", split)
for path in sys.argv[3:]:
  if path == "shipped":
    p = pair.m_params
  elif path.startswith("model:"):
    from specdec_jax.checkpoints import native
    _, p = native.load(path[6:], dtype="float32")
  elif path.startswith("avg:"):
    ps = [pair.m_params if q == "shipped" else tdm._load_npz_params(q, pair.medium) for q in path[4:].split(",")]
    p = jax.tree_util.tree_map(lambda *xs: sum(jnp.asarray(x, jnp.float32) for x in xs) / len(xs), *ps)
    p = jax.tree_util.tree_map(lambda x: jnp.asarray(x).astype(jnp.bfloat16).astype(jnp.float32), p)
  else:
    p = tdm._load_npz_params(path, pair.medium)
    p = jax.tree_util.tree_map(lambda x: jnp.asarray(x).astype(jnp.bfloat16).astype(jnp.float32), p)
  pr = dataclasses.replace(pair, m_params=p)
  _, s = dme.decode(pr, decoding.make_method("spec_decode"), exs, drafter="medium", verifier="large")
  own, _ = dme.decode(pr, decoding.make_method("target_only"), exs, verifier="medium")
  print(path, dict(alpha=round(s["accepted"] / (s["accepted"] + s["rejected"]), 4),
        bleu=round(metrics.bleu([e["targets"] for e in exs], own), 2)), flush=True)
