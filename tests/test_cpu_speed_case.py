"""scripts/bench_cpu_speed_case.py on a tiny verifier size.

Checks what the benchmark computes and records, not how fast anything is:
the speed pair's drafter is exactly the verifier's first layers (a subset of
its parameter tree, equal to a truncated model), the block loop times what it
says, greedy SpecDecode on the pair equals target-only, and the JSON /
Markdown files say the same as each other.
"""

import json
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import models
from tests import load_script



@pytest.fixture(scope="module")
def bench():
  name = "bench_cpu_speed_case_under_test"
  module = load_script("bench_cpu_speed_case", name)
  module.SIZES = {"gemma-tiny": (32, 3, 2, 64), "gemma-tiny2": (64, 2, 2, 128)}
  module.VOCAB = 64
  yield module
  del sys.modules[name]


def test_unknown_size_is_a_clear_error(bench):
  with pytest.raises(ValueError, match="unknown size 'gemma-9b'.*gemma-tiny"):
    bench.verifier_config("gemma-9b")


def test_speed_pair_drafter_is_the_verifiers_first_layers(bench):
  drafter, verifier, q, p = bench.speed_pair("gemma-tiny", drafter_layers=1)
  assert drafter.config.num_layers == 1 and verifier.config.num_layers == 3
  assert set(q) < set(p)
  assert sorted(k for k in q if k.startswith("layer_")) == ["layer_0"]
  for k in q:  # shared arrays, not copies
    assert q[k] is p[k]
  # The drafter's logits are those of a verifier with layers 1-2 removed.
  toks = jnp.asarray([[2, 5, 9, 11]], jnp.int32)
  logits, _ = drafter.step(q, toks, drafter.init_cache(1, 8))
  trunc = models.GemmaModel(drafter.config)
  ref, _ = trunc.step({k: p[k] for k in q}, toks, trunc.init_cache(1, 8))
  np.testing.assert_array_equal(np.asarray(logits), np.asarray(ref))
  assert np.isfinite(np.asarray(logits)).all()


def test_measure_b_and_speedup_rows(bench):
  r = bench.measure_b("gemma-tiny", "float32", gamma=3, iters=2, repeats=2)
  assert r["size"] == "gemma-tiny" and r["dtype"] == "float32"
  assert r["params"] == models.GemmaModel(
      bench.verifier_config("gemma-tiny")).num_params()
  assert r["step_ms"] > 0 and r["block_ms"] > 0 and r["b"] > 0
  s = bench.measure_speedup("gemma-tiny", "float32", gamma=3,
                            drafter_layers=1, new_tokens=6, prompts=2,
                            repeats=1)
  assert s["identical_to_target"] is True  # greedy SpecDecode is exact
  assert 0 <= s["acceptance_rate"] <= 1
  assert s["speedup"] > 0 and s["target_only_tokens_per_s"] > 0


def test_main_writes_consistent_json_and_markdown(bench, tmp_path,
                                                  monkeypatch):
  out = str(tmp_path / "speed")
  monkeypatch.setattr(sys, "argv", [
      "bench_cpu_speed_case.py", "--sizes", "gemma-tiny,gemma-tiny2",
      "--dtypes", "float32", "--gamma", "2", "--iters", "2", "--repeats",
      "2", "--threshold", "1000", "--speedup", "auto", "--new_tokens", "4",
      "--prompts", "1", "--out", out])
  bench.main()
  with open(out + ".json") as f:
    result = json.load(f)
  with open(out + ".md") as f:
    md = f.read()
  assert [r["size"] for r in result["b"]] == ["gemma-tiny", "gemma-tiny2"]
  # threshold 1000: the first size is the smallest "memory-bound" one.
  assert result["smallest_memory_bound"] == {"float32": "gemma-tiny"}
  assert [s["size"] for s in result["speedup"]] == ["gemma-tiny"]
  for r in result["b"]:
    assert f"| {r['size']} | float32 | {r['params']:,} |" in md
    assert f"| {r['b']} |" in md
  assert "smallest verifier with b <= 1000.0: gemma-tiny" in md
  assert "identical output: True" in md
