"""Multi-device checks, run by tests/test_sharding.py in a subprocess with
XLA_FLAGS=--xla_force_host_platform_device_count=8 (8 fake CPU devices)."""

import json
import sys

import jax
import numpy as np

jax.config.update("jax_default_matmul_precision", "highest")

from specdec_jax import decoding, models, sharding  # noqa: E402

MESHES = {"1x8": (1, 8), "2x4": (2, 4), "8x1": (8, 1)}


def pair(family):
  """A tiny pair whose heads / kv heads / mlp / vocab divide by 8."""
  if family == "gemma":
    cfg = models.GemmaConfig(vocab_size=64, d_model=32, num_layers=2,
                             num_heads=8, num_kv_heads=8, head_dim=4,
                             mlp_dim=64, attention_types=("local", "global"),
                             sliding_window=6, attn_logit_softcap=50.0,
                             final_logit_softcap=30.0, use_post_attn_norm=True,
                             use_post_ffw_norm=True)
    dcfg = models.GemmaConfig(**{**cfg.__dict__, "num_layers": 1,
                                 "attention_types": ("local",)})
  else:
    cfg = models.T5Config(vocab_size=64, d_model=32, num_heads=8, head_dim=4,
                          num_encoder_layers=2, num_decoder_layers=2,
                          mlp_dim=64, relpos_buckets=8, relpos_max_distance=16)
    dcfg = models.T5Config(**{**cfg.__dict__, "num_decoder_layers": 1})
  v, d = models.model_from_config(cfg), models.model_from_config(dcfg)
  pp = v.init_params(jax.random.PRNGKey(0))
  qp = d.init_params(jax.random.PRNGKey(1))
  if family == "gemma":
    pp["embedder"]["input_embedding"] *= 3.0
    qp["embedder"]["input_embedding"] *= 3.0
  return d, v, qp, pp


def requests(family, n=3):
  rng = np.random.default_rng(0)
  rows = [list(rng.integers(3, 64, size=k)) for k in (5, 2, 7, 3, 4)[:n]]
  if family == "t5":
    return dict(inputs=rows)
  return dict(prompts=[[2] + r for r in rows])


def decode(family, name, knobs, mesh=None, tree=None):
  """One batch of 3 requests; greedy AND sampled rows in one program.

  Row 0 decodes greedily (temperature 0), rows 1-2 sample (top-p, their own
  temperatures); per-row alphas travel with their rows. Greedy-only methods
  (BiLD, LossyGreedy) decode every row greedily.
  """
  d, v, qp, pp = pair(family)
  greedy_only = name in ("bild", "lossy_greedy")
  n = 3
  if not greedy_only:
    strategy = decoding.TopP([1.0, 0.9, 0.8][:n], temperature=[0.0, 0.5,
                                                               0.8][:n])
    knobs = {k: [v, v * 0.5, v * 0.8] if k.startswith("alpha") else v
             for k, v in knobs.items()}
  else:
    strategy = decoding.Greedy()
  out = decoding.generate(decoding.make_method(name, **knobs), d, v, qp, pp,
                          sampling=strategy, gamma=3, max_new_tokens=10,
                          seeds=[3, 4, 5], eos_id=None, mesh=mesh,
                          tree=tree, **requests(family, n))
  return out.sequences(), out.accepted.tolist(), out.verifier_calls.tolist()


KNOBS = {"lossy": dict(alpha=0.5, beta=1.0), "lossy_tuned": dict(alpha=0.5),
         "lossy_greedy": dict(alpha=0.5), "chow": dict(alpha=0.5),
         "diff": dict(alpha=0.1), "opt": dict(alpha=0.5),
         "chow_log": dict(alpha=2.0), "diff_log": dict(alpha=0.1),
         "opt_log": dict(alpha=0.5), "token_v1": dict(alpha=0.2),
         "token_v2": dict(alpha=0.2), "token_v3": dict(alpha=0.5),
         "bild_star": dict(alpha=0.3), "token_cascade": dict(alpha=0.5),
         "oracle_diff": dict(alpha=0.1), "oracle_opt": dict(alpha=0.5),
         "seq_cascade": dict(alpha=0.5),
         "bild": dict(alpha_fallback=0.3, alpha_rollback=3.0)}


SHARDING_METHODS = ("target_only", "drafter_only", "spec_decode",
                    "lossy_greedy", "lossy", "opt", "token_v3", "bild",
                    "token_cascade", "oracle_opt", "seq_cascade")


def check_methods(family, mesh_names, methods, tree=None):
  mismatches = []
  for name in methods:
    ref = decode(family, name, dict(KNOBS.get(name, {})), tree=tree)
    for mesh_name in mesh_names:
      data, model = MESHES[mesh_name]
      mesh = sharding.make_mesh(data=data, model=model)
      got = decode(family, name, dict(KNOBS.get(name, {})), mesh, tree=tree)
      if ref != got:
        mismatches.append([family, mesh_name, name, ref, got])
  return mismatches


def hierarchy(mesh=None):
  """A 3-level stack (drafter -> the verifier's first layer -> verifier)
  on 3 requests: row 0 greedy, rows 1-2 sampled (top-p, own temperatures)."""
  d, v, qp, pp = pair("gemma")
  levels = [(d, qp), (models.early_exit(v, 1), pp), (v, pp)]
  strategy = decoding.TopP([1.0, 0.9, 0.8], temperature=[0.0, 0.5, 0.8])
  out = decoding.generate_hierarchy(
      levels, [2, 3], sampling=strategy, max_new_tokens=10, seeds=[3, 4, 5],
      eos_id=None, mesh=mesh, **requests("gemma", 3))
  return (out.sequences(), out.calls.tolist(), out.level_drafted.tolist(),
          out.level_accepted.tolist())


def check_hierarchy(mesh_names):
  ref = hierarchy()
  out = []
  for name in mesh_names:
    data, model = MESHES[name]
    got = hierarchy(sharding.make_mesh(data=data, model=model))
    if got != ref:
      out.append(["gemma", name, "hierarchy", ref, got])
  return out


def param_bytes_ratio():
  d, v, qp, pp = pair("gemma")
  mesh = sharding.make_mesh(data=1, model=8)
  placed = jax.device_put(pp, sharding.param_shardings(pp, mesh))
  total = sum(x.nbytes for x in jax.tree.leaves(placed))
  dev0 = jax.devices()[0]
  local = sum(s.data.nbytes for x in jax.tree.leaves(placed)
              for s in x.addressable_shards if s.device == dev0)
  return local / total


def main(which):
  if which == "all_methods":
    # One method per loop kind and rule family: sharding can only differ in
    # the model steps and the loop's gathers/commits, not in the per-row
    # elementwise rules (the tiny golden record replays all of them).
    result = check_methods("gemma", ["2x4"], list(SHARDING_METHODS))
  elif which == "meshes":
    result = (check_methods("gemma", ["1x8", "8x1"],
                            ["spec_decode", "token_v3", "seq_cascade"]) +
              check_methods("t5", ["1x8", "2x4", "8x1"],
                            ["spec_decode", "opt"]))
  elif which == "trees":  # tree verification (tree arrays are batch rows)
    tree = decoding.Tree(decoding.Topology.from_widths([[3], [2, 1, 0]]))
    result = (check_methods("gemma", ["2x4"],
                            ["spec_decode", "token_v3"], tree) +
              check_methods("t5", ["1x8"], ["opt"], decoding.Tree(
                  decoding.Topology.kary(2, 2), "top_k")))
  elif which == "hierarchy":  # a 3-level stack with an early-exit level
    result = check_hierarchy(["2x4"])
  elif which == "bytes":
    result = param_bytes_ratio()
  else:
    raise ValueError(which)
  print("RESULT " + json.dumps(result))


if __name__ == "__main__":
  main(sys.argv[1])
