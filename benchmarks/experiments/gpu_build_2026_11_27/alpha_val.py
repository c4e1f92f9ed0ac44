"""Greedy alpha (medium > large) and the medium's BLEU on a split: the
shipped medium against its on-policy round's last parameters.

    PYTHONPATH=. python benchmarks/experiments/gpu_build_2026_11_27/alpha_val.py \
        OUT_DIR WORKDIR/t5_codegen/medium/onpolicy validation
"""

import dataclasses
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, "scripts")
import default_models_plan as plan  # pylint: disable=wrong-import-position
from specdec_jax import decoding  # pylint: disable=wrong-import-position
from specdec_jax import train as train_lib  # pylint: disable=wrong-import-position
from specdec_jax.eval import default_models as dm  # pylint: disable=wrong-import-position
from specdec_jax.eval import default_models_eval as dme  # pylint: disable=wrong-import-position
from specdec_jax.eval import metrics  # pylint: disable=wrong-import-position


def main(out: str, onpolicy_dir: str, split: str) -> None:
  pair = dm.load("t5_codegen", assets=out)
  exs = dm.examples("t5_codegen", split)
  st = plan.stage("t5_codegen", "medium_onpolicy")
  state = train_lib.restore_state(
      onpolicy_dir, train_lib.init_state(pair.m_params, st.config))
  # as shipped: bfloat16 values
  last = jax.tree_util.tree_map(
      lambda x: jnp.asarray(x).astype(jnp.bfloat16).astype(jnp.float32),
      jax.device_get(state[0].params))
  print("last step", int(state[0].step), flush=True)
  for name, params in (("shipped", pair.m_params), ("last", last)):
    pr = dataclasses.replace(pair, m_params=params)
    _, s = dme.decode(pr, decoding.make_method("spec_decode"), exs,
                      drafter="medium", verifier="large")
    own, _ = dme.decode(pr, decoding.make_method("target_only"), exs,
                        verifier="medium")
    print(name, dict(
        alpha=s["accepted"] / (s["accepted"] + s["rejected"]),
        acceptance=s["accepted"] / s["drafted"],
        bleu=metrics.bleu([e["targets"] for e in exs], own)), flush=True)


if __name__ == "__main__":
  main(*sys.argv[1:4])
