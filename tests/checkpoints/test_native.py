"""specdec_jax's own checkpoint format round-trips exactly."""

import json
import os

import jax
import numpy as np
import pytest

from specdec_jax import models
from specdec_jax.checkpoints import native


@pytest.mark.parametrize("name", ["t5_tiny", "gemma2_tiny"])
def test_roundtrip_float32_and_bfloat16(name, tmp_path):
  model = models.get_model(name)
  params = model.init_params(jax.random.PRNGKey(0))
  native.save(str(tmp_path / "f32"), model, params)
  m2, p2 = native.load(str(tmp_path / "f32"))
  assert m2 == model
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(p2)):
    np.testing.assert_array_equal(a, b)
  native.save(str(tmp_path / "bf16"), model, params, dtype="bfloat16")
  _, p3 = native.load(str(tmp_path / "bf16"), dtype=None)
  assert all(x.dtype == "bfloat16" for x in jax.tree.leaves(p3))
  size = os.path.getsize(tmp_path / "bf16" / native.PARAMS)
  assert size < os.path.getsize(tmp_path / "f32" / native.PARAMS) * 0.55


def test_corrupt_checkpoints(tmp_path):
  model = models.get_model("gemma_tiny")
  native.save(str(tmp_path), model, model.init_params(jax.random.PRNGKey(0)))
  data = (tmp_path / native.PARAMS).read_bytes()
  (tmp_path / native.PARAMS).write_bytes(data[:len(data) // 2])
  with pytest.raises(ValueError, match="truncated or corrupt"):
    native.load(str(tmp_path))
  (tmp_path / native.CONFIG).write_text(json.dumps({"family": "llama"}))
  with pytest.raises(ValueError, match="unknown model family 'llama'"):
    native.load(str(tmp_path))
  with pytest.raises(ValueError, match="does not exist"):
    native.load(str(tmp_path / "nope"))
  os.remove(tmp_path / native.PARAMS)
  with pytest.raises(ValueError, match="missing params.safetensors"):
    native.load(str(tmp_path))
