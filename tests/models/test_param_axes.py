"""Logical axes are declared by the layers and read by sharding.py."""

import re

import flax.linen as nn
import jax
import numpy as np
import pytest

from specdec_jax import models, sharding
from specdec_jax.models import axes as axes_lib

# The regex table sharding.py held before the axes moved next to the layers
# (commit 61f6ba5), kept as the reference the declarations must reproduce.
OLD_PARAM_AXES = (
    (r"token_embedder/embedding$", ("vocab", "embed")),
    (r"relpos_bias/rel_embedding$", ("heads", "relpos_buckets")),
    (r"(attention|self_attention|encoder_decoder_attention)/"
     r"(query|key|value)/kernel$", ("embed", "joined_kv")),
    (r"(attention|self_attention|encoder_decoder_attention)/out/kernel$",
     ("joined_kv", "embed")),
    (r"mlp/wi_[01]/kernel$", ("embed", "mlp")),
    (r"mlp/wo/kernel$", ("mlp", "embed")),
    (r"logits_dense/kernel$", ("embed", "vocab")),
    (r"embedder/input_embedding$", ("vocab", "embed")),
    (r"attn/q/kernel$", ("embed", "heads", "head_dim")),
    (r"attn/kv/kernel$", ("embed", "stack", "kv_heads", "head_dim")),
    (r"attn/out/kernel$", ("heads", "head_dim", "embed")),
    (r"mlp/gating/kernel$", ("embed", "stack", "mlp")),
    (r"mlp/linear/kernel$", ("mlp", "embed")),
    (r"attn/(query|key)_norm/scale$", ("head_dim",)),  # Gemma 3 QK-norm
    (r"(norm|layer_norm)/scale$", ("embed",)),
)


def _old_axes(path):
  for pattern, axes in OLD_PARAM_AXES:
    if re.search(pattern, path):
      return axes
  raise AssertionError(f"the old table has no rule for {path}")


@pytest.mark.parametrize("name", sorted(models.PRESETS))
def test_every_preset_gets_the_old_tables_axes(name):
  model = models.get_model(name)
  shapes = model.param_shapes()
  got = models.flatten_params(sharding.param_logical_axes(shapes))
  flat = models.flatten_params(shapes)
  assert set(got) == set(flat)
  for path, axes in got.items():
    assert axes == _old_axes(path), path
    assert len(axes) == len(flat[path].shape), path
  # The model's own declarations say the same.
  assert models.flatten_params(model.param_axes()) == got


def test_merged_draft_target_tree_matches_by_suffix():
  t5 = models.get_model("t5_tiny").param_shapes()
  g2 = models.get_model("gemma2_tiny").param_shapes()
  merged = {"draft": g2, "target": {"draft": t5}}
  got = models.flatten_params(sharding.param_logical_axes(merged))
  assert got["target/draft/decoder/layers_1/mlp/wo/kernel"] == ("mlp", "embed")
  assert got["draft/layer_0/post_ffw_norm/scale"] == ("embed",)
  assert got["draft/layer_1/attn/kv/kernel"] == ("embed", "stack", "kv_heads",
                                                 "head_dim")


def test_unknown_and_misshaped_parameters_raise():
  with pytest.raises(ValueError, match="no logical-axis rule for parameter "
                     "'layer_0/attn/bias'; .*param_with_axes"):
    sharding.param_logical_axes({"layer_0": {"attn": {"bias": np.zeros(3)}}})
  with pytest.raises(ValueError, match="do not fit parameter 'final_norm"):
    sharding.param_logical_axes({"final_norm": {"scale": np.zeros((2, 3))}})


def test_declared_table_uses_layer_wildcards():
  table = axes_lib.declared_param_axes()
  assert table["decoder/layers_*/self_attention/query/kernel"] == (
      "embed", "joined_kv")
  assert table["layer_*/attn/q/kernel"] == ("embed", "heads", "head_dim")
  assert not any(re.search(r"layers?_\d", p) for p in table)
  assert axes_lib.path_pattern("a/layers_12/b/layer_3") == "a/layers_*/b/layer_*"


@pytest.mark.parametrize("family", ["t5", "gemma2"])
def test_params_are_plain_arrays_and_init_unchanged(family):
  model = models.get_model(f"{family}_tiny")
  params = model.init_params(jax.random.PRNGKey(0))
  boxed = lambda x: isinstance(x, nn.LogicallyPartitioned)
  assert not any(boxed(x) for x in jax.tree.leaves(params, is_leaf=boxed))
  assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(params))
  shapes = model.param_shapes()
  assert all(isinstance(x, jax.ShapeDtypeStruct)
             for x in jax.tree.leaves(shapes))
  model.check_params(params)
