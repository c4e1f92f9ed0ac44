"""The checkpoint merge tool: round trips, CLI, checks."""

import os

import jax
import ml_dtypes
import numpy as np
import pytest

from specdec_jax import models
from specdec_jax.checkpoints import t5x as t5x_ckpt
from specdec_jax.checkpoints import t5x_write
from specdec_jax.t5x import merge


def _params(seed):
  model = models.get_model("t5_tiny")
  return jax.tree.map(np.asarray, model.init_params(jax.random.PRNGKey(seed)))


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
  root = tmp_path_factory.mktemp("ckpts")
  draft, target = _params(1), _params(2)
  t5x_write.save_t5x(str(root / "draft" / "checkpoint_100"), draft, step=100)
  t5x_write.save_t5x(str(root / "draft" / "checkpoint_300"), draft, step=300)
  t5x_write.save_t5x(str(root / "target" / "checkpoint_200"), target,
                    step=200, layout="orbax")
  return root, draft, target


def _assert_tree_equal(a, b):
  fa, fb = models.flatten_params(a), models.flatten_params(b)
  assert set(fa) == set(fb)
  for k in fa:
    np.testing.assert_array_equal(np.asarray(fa[k]), np.asarray(fb[k]), k)


def test_cli_round_trip_legacy(ckpts, tmp_path, capsys):
  root, draft, target = ckpts
  rc = merge.main(["--draft", str(root / "draft"),  # model dir: latest step
                   "--target", str(root / "target" / "checkpoint_200"),
                   "--output", str(tmp_path / "merged"), "--step", "7",
                   "--draft_preset", "t5_tiny", "--target_preset",
                   "t5_tiny"])
  assert rc == 0
  out = str(tmp_path / "merged" / "checkpoint_7")
  assert capsys.readouterr().out.strip() == out
  assert t5x_ckpt.detect_t5x_format(out) == "t5x"
  tree = t5x_ckpt.load_t5x_tree(out)
  assert set(tree) == {"draft", "target"}
  _assert_tree_equal(tree["draft"], draft)
  _assert_tree_equal(tree["target"], target)
  # Each half restores as a model through the checkpoint reader.
  restored = t5x_ckpt.load_t5x(out, "t5_tiny", dtype="float32",
                               subtree="target/draft")
  _assert_tree_equal(restored, draft)


def test_orbax_layout_and_dtype_cast(ckpts, tmp_path):
  root, draft, target = ckpts
  out = merge.merge(str(root / "draft" / "checkpoint_100"),
                    str(root / "target"), str(tmp_path), step=0,
                    dtype="bfloat16", layout="orbax")
  assert out == os.path.join(str(tmp_path), "checkpoint_0")
  assert t5x_ckpt.detect_t5x_format(out) == "orbax"
  tree = t5x_ckpt.load_t5x_tree(out)
  leaf = tree["target"]["decoder"]["logits_dense"]["kernel"]
  assert leaf.dtype == ml_dtypes.bfloat16
  np.testing.assert_array_equal(
      leaf, target["decoder"]["logits_dense"]["kernel"].astype(
          ml_dtypes.bfloat16))
  assert tree["draft"]["token_embedder"]["embedding"].dtype == \
      ml_dtypes.bfloat16


def test_checks_fail_before_writing(ckpts, tmp_path, capsys):
  root, _, _ = ckpts
  out = tmp_path / "merged"
  rc = merge.main(["--draft", str(root / "draft"), "--target",
                   str(root / "target"), "--output", str(out),
                   "--target_preset", "t5_1_1_small"])
  assert rc == 2
  err = capsys.readouterr().err
  assert "merge: error:" in err and "t5_1_1_small" in err and "shape" in err
  assert not out.exists()
  merged = merge.merge(str(root / "draft"), str(root / "target"),
                       str(tmp_path / "m"))
  with pytest.raises(ValueError, match="already a merged"):
    merge.merge(merged, str(root / "target"), str(tmp_path / "again"))
  with pytest.raises(ValueError, match="already exists"):
    merge.merge(str(root / "draft"), str(root / "target"),
                str(tmp_path / "m"))
  with pytest.raises(ValueError, match="does not exist"):
    merge.merge(str(tmp_path / "nope"), str(root / "target"),
                str(tmp_path / "x"))
  with pytest.raises(ValueError, match="step must be"):
    merge.merge(str(root / "draft"), str(root / "target"), str(tmp_path),
                step=-1)
  with pytest.raises(SystemExit):  # argparse: --target is required
    merge.main(["--draft", "a", "--output", "b"])
