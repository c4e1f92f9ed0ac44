"""Sharded decoding on 8 fake CPU devices equals the single-device run."""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from specdec_jax import models, sharding

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run_checks(which):
  env = dict(os.environ,
             XLA_FLAGS="--xla_force_host_platform_device_count=8",
             JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  proc = subprocess.run([sys.executable, "tests/sharding_checks.py", which],
                        cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=1500)
  assert proc.returncode == 0, proc.stderr[-4000:]
  line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
  import json  # pylint: disable=g-import-not-at-top
  return json.loads(line[-1][len("RESULT "):])


@pytest.mark.slow
def test_every_method_greedy_and_sampled_on_a_2x4_mesh():
  assert _run_checks("all_methods") == []


@pytest.mark.slow
def test_1x8_8x1_meshes_and_t5():
  assert _run_checks("meshes") == []


@pytest.mark.slow
def test_tree_decoding_on_meshes_equals_one_device():
  """Tree verification with data and model axes (2x4 for Gemma, 1x8 for T5), greedy and
  sampled rows, bit for bit equal to the single-device run."""
  assert _run_checks("trees") == []


@pytest.mark.slow
def test_hierarchy_on_a_data_x_model_mesh_equals_one_device():
  """A 3-level hierarchy (drafter, early exit of the verifier, verifier) on
  a 2x4 mesh, greedy and sampled rows: tokens and per-level counters equal
  the single-device run bit for bit."""
  assert _run_checks("hierarchy") == []


def test_parameter_bytes_per_device_under_model_parallelism():
  ratio = _run_checks("bytes")
  assert 1 / 8 <= ratio < 0.16, ratio  # ~1/8 plus replicated norm scales


def test_logical_rules_and_specs():
  mesh = sharding.make_mesh()
  p = models.get_model("gemma2_27b").param_shapes()
  axes = sharding.param_logical_axes(p)
  assert axes["layer_0"]["attn"]["q"]["kernel"] == ("embed", "heads",
                                                     "head_dim")
  spec = sharding.logical_to_spec(("embed", "heads", "head_dim"))
  assert tuple(spec) == ("fsdp", "model", None)
  # 4 heads do not divide an 8-way axis: that dimension is replicated.
  fake = type("M", (), {"shape": {"data": 1, "fsdp": 1, "model": 8}})()
  assert tuple(sharding.logical_to_spec(("embed", "heads"), shape=(8, 4),
                                        mesh=fake)) == ("fsdp", None)
  with pytest.raises(ValueError, match="no logical-axis rule for parameter "
                     "'layer_0/attn/bias'"):
    sharding.param_logical_axes({"layer_0": {"attn": {"bias": np.zeros(3)}}})
  with pytest.raises(ValueError, match="mesh data=3 x fsdp=1 x model=1"):
    sharding.make_mesh(data=3)
  assert len(jax.devices()) >= 1 and mesh.shape["data"] == 1


def test_memory_plan_matches_hand_computation():
  from specdec_jax import plan  # pylint: disable=g-import-not-at-top
  rows = plan.memory_plan(batches=(1, 32))
  row = next(r for r in rows if r["pair"] == "gemma2_2b + gemma2_27b"
             and r["topology"] == "v4-8" and r["batch"] == 32)
  n27 = models.get_model("gemma2_27b").num_params()
  n2 = models.get_model("gemma2_2b").num_params()
  # bf16 weights split over 4 chips (only the norm scales are replicated).
  assert abs(row["params_gib"] - (n27 + n2) * 2 / 4 / 2**30) < 0.01
  # KV caches: layers x {k, v} x batch x slots x kv_heads x head_dim x 2 B,
  # kv heads split over the 4 chips; slots = 2048 + 256 + gamma 1 + 2.
  slots = 2048 + 256 + 1 + 2
  kv = lambda m: (m.num_layers * 2 * 32 * slots * m.num_kv_heads *
                  m.head_dim * 2 / 4)
  expect = (kv(models.PRESETS["gemma2_27b"]) +
            kv(models.PRESETS["gemma2_2b"])) / 2**30
  assert abs(row["caches_gib"] - expect) < 1e-6
  assert all(r["fits"] for r in rows)
  assert "| gemma2_2b + gemma2_27b | v4-8 (4) | 32 |" in plan.format_plan(rows)
  with pytest.raises(ValueError, match="unknown topology 'v4-1024'"):
    plan.memory_plan(topologies=("v4-1024",))
