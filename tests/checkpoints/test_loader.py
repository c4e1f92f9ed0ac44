"""checkpoints.load / save: format detection, model argument, leaf-by-leaf
restore, sharding, progress bar and argument errors."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from tests.checkpoints.helpers import assert_same, tiny

from specdec_jax import checkpoints, models
from specdec_jax.checkpoints import loader


@pytest.mark.parametrize("fmt,name", [
    ("native", "gemma2_tiny"), ("hf", "t5_tiny"), ("hf", "gemma_tiny"),
    ("t5x", "t5_tiny"), ("t5x_orbax", "t5_tiny"), ("gemma", "gemma2_tiny")])
def test_every_format_round_trips(fmt, name, tmp_path):
  model, params = tiny(name)
  path = str(tmp_path / "checkpoint_1")
  checkpoints.save(path, name, params, format=fmt)
  assert checkpoints.detect_format(path) == fmt
  needs_model = fmt in ("t5x", "t5x_orbax", "gemma")
  got_model, got = checkpoints.load(path, name if needs_model else None,
                                    dtype=None)
  assert got_model == model
  assert_same(got, params)
  _, bf16 = checkpoints.load(path, model)  # default dtype: bfloat16
  assert_same(bf16, jax.tree.map(lambda x: x.astype("bfloat16"), params))
  if needs_model:
    with pytest.raises(ValueError, match=(
        f"'{fmt}' checkpoints hold no model config: pass model=")):
      checkpoints.load(path)


def test_model_argument_with_configured_formats(tmp_path):
  model, params = tiny("gemma_tiny")
  checkpoints.save(str(tmp_path), model, params, format="hf")
  compute_bf16 = models.get_model("gemma_tiny", dtype="bfloat16")
  got_model, _ = checkpoints.load(str(tmp_path), compute_bf16)
  assert got_model is compute_bf16  # only dtype settings may differ
  with pytest.raises(ValueError, match=(
      "model config does not match checkpoint .*: num_kv_heads=2 in the "
      "model, 1 in the checkpoint")):
    checkpoints.load(str(tmp_path), "gemma2_tiny")
  with pytest.raises(ValueError, match="holds a GemmaModel, model is a "
                     "T5Model"):
    checkpoints.load(str(tmp_path), "t5_tiny")
  with pytest.raises(ValueError, match="unknown model preset 'gemma_huge'"):
    checkpoints.load(str(tmp_path), "gemma_huge")
  with pytest.raises(ValueError, match="model must be a preset name"):
    checkpoints.load(str(tmp_path), 3)
  with pytest.raises(ValueError, match="T5X checkpoints hold T5 models"):
    checkpoints.save(str(tmp_path / "x"), model, params, format="t5x")


def _logged_leaves(params, log, sliced_every=2):
  """Leaves of ``params`` whose reads are logged as ('read', path, index)."""
  leaves = []
  for i, (path, arr) in enumerate(sorted(models.flatten_params(
      params).items())):
    host = np.asarray(arr)

    def read(dtype, index, path=path, host=host):
      log.append(("read", path, index))
      return host if index is None else host[index]
    leaves.append(loader.Leaf(path, host.shape, host.dtype, read,
                              source=f"test {path}",
                              sliced=i % sliced_every == 0))
  return leaves


def test_restore_reads_and_places_one_leaf_at_a_time():
  model, params = tiny("t5_tiny")
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("x",))
  log = []

  def sharding(path, shape):
    log.append(("shard", path, shape))
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

  leaves = _logged_leaves(params, log)
  got = loader.restore(leaves, model, dtype="float32", sharding=sharding)
  assert_same(got, params)
  # Per leaf: its sharding, then its read; never all reads first.
  expected = []
  for leaf in leaves:
    index = tuple(slice(None) for _ in leaf.shape) if leaf.sliced else None
    expected += [("shard", leaf.path, leaf.shape),
                 ("read", leaf.path, index)]
  assert [(e, p) for e, p, _ in log] == [(e, p) for e, p, _ in expected]
  for (event, _, got), (_, _, want) in zip(log, expected):
    if event == "shard" or want is None:
      assert got == want
    else:  # sliced leaves are read per device shard (one device: all of it)
      assert [(s.start, s.stop) for s in got] == [(None, None)] * len(want)


def test_restore_checks_before_reading():
  model, params = tiny("t5_tiny")
  log = []
  leaves = _logged_leaves(params, log)
  bad = leaves[:-1] + [loader.Leaf(leaves[-1].path, (7,), np.float32,
                                   leaves[-1].read, "test")]
  assert leaves[-1].path == "token_embedder/embedding"
  with pytest.raises(ValueError, match=(
      r"checkpoint 'ckpt' leaf 'token_embedder/embedding' has shape \(7,\), "
      r"expected \(64, 32\)")):
    loader.restore(bad, model, source="ckpt")
  assert not log  # nothing was read


def test_progress_bar(tmp_path, capsys):
  model, params = tiny("gemma_tiny")
  checkpoints.save(str(tmp_path / "ckpt"), model, params)
  capsys.readouterr()
  checkpoints.load(str(tmp_path / "ckpt"))  # tiny: no bar by default
  assert "loading" not in capsys.readouterr().err
  checkpoints.load(str(tmp_path / "ckpt"), progress=True)
  assert "loading ckpt" in capsys.readouterr().err


def test_bad_arguments(tmp_path):
  model, params = tiny("gemma_tiny")
  path = str(tmp_path / "ckpt")
  checkpoints.save(path, model, params)
  with pytest.raises(ValueError, match="unknown checkpoint format 'zip'"):
    checkpoints.load(path, format="zip")
  with pytest.raises(ValueError, match="unknown checkpoint format 'zip'"):
    checkpoints.save(path, model, params, format="zip")
  with pytest.raises(ValueError, match="subtree= applies to T5X checkpoints "
                     "only, this one is 'native'"):
    checkpoints.load(path, subtree="target/draft")
  with pytest.raises(ValueError, match="sharding must be None, a "
                     "jax.sharding.Sharding or a callable"):
    checkpoints.load(path, sharding=42)
  with pytest.raises(ValueError, match=(
      r"sharding\('embedder/input_embedding', \(64, 32\)\) returned str")):
    checkpoints.load(path, sharding=lambda p, s: "replicated")
  with pytest.raises(ValueError, match="dtype must be a floating-point"):
    checkpoints.load(path, dtype="int32")
  with pytest.raises(ValueError, match="does not exist"):
    checkpoints.load(str(tmp_path / "nope"))
  empty = tmp_path / "empty"
  empty.mkdir()
  with pytest.raises(ValueError, match="checkpoint directory .* is empty"):
    checkpoints.load(str(empty))
  torch_dir = tmp_path / "torch"
  torch_dir.mkdir()
  (torch_dir / "config.json").write_text(json.dumps({"model_type": "t5"}))
  with pytest.raises(ValueError, match="has a config.json but no "
                     r"\*.safetensors"):
    checkpoints.load(str(torch_dir))
  (torch_dir / "pytorch_model.bin").write_bytes(b"\0")
  with pytest.raises(ValueError, match="PyTorch .bin weights, which are not "
                     "supported"):
    checkpoints.load(str(torch_dir))


_MULTI_DEVICE = r"""
import collections, json, sys
import jax, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from specdec_jax import models
from specdec_jax.checkpoints import leaves, t5x, t5x_write

model = models.get_model("t5_tiny")
rng = np.random.default_rng(0)
params = jax.tree.map(lambda s: rng.normal(size=s.shape).astype(np.float32),
                      model.param_shapes())
t5x_write.save_t5x(sys.argv[1], params)
mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(2, 4),
                         ("data", "model"))

def by_leaf(path, shape):
  split = path.endswith("kernel") and shape[1] % 4 == 0
  return NamedSharding(mesh, P(None, "model") if split else P())

reads = collections.Counter()
read_leaf = leaves.read_leaf
def counting(leaf, dtype, what, index=None):
  reads[leaf.path] += 1
  return read_leaf(leaf, dtype, what, index)
leaves.read_leaf = counting
got = models.flatten_params(t5x.load_t5x(sys.argv[1], model, dtype="float32",
                                         sharding=by_leaf,
                                         verify_checksums=False))
want = models.flatten_params(params)
q = got["encoder/layers_0/attention/query/kernel"]
result = {
    "equal": all(np.array_equal(np.asarray(got[k]), want[k]) for k in want),
    "devices": len(q.sharding.device_set),
    "shard_shapes": sorted({tuple(s.data.shape) for s in q.addressable_shards}),
    "query_reads": reads["encoder/layers_0/attention/query/kernel"],
    "norm_reads": reads["encoder/encoder_norm/scale"]}
reads.clear()  # with the checksums: each leaf is read whole once, checked
got = models.flatten_params(t5x.load_t5x(sys.argv[1], model, dtype="float32",
                                         sharding=by_leaf))
result.update(
    verified_equal=all(np.array_equal(np.asarray(got[k]), want[k])
                       for k in want),
    verified_query_reads=reads["encoder/layers_0/attention/query/kernel"])
print("RESULT " + json.dumps(result))
"""


def test_sharded_restore_on_8_devices_reads_each_slice_once(tmp_path):
  """T5X zarr leaves on a 2x4 mesh: each device gets its slice; devices that
  hold the same slice (replicas over 'data') share one TensorStore read.
  With the checksum manifest checked, each leaf is read whole once instead
  (a checksum covers the whole tensor), then sliced on the host."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))))
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
             JAX_PLATFORMS="cpu", PYTHONPATH=root)
  proc = subprocess.run([sys.executable, "-c", _MULTI_DEVICE,
                         str(tmp_path / "checkpoint_1")], cwd=root, env=env,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
  assert json.loads(line[-1][len("RESULT "):]) == {
      "equal": True, "devices": 8, "shard_shapes": [[32, 8]],
      "query_reads": 4,  # 4 column slices, each read once for both replicas
      "norm_reads": 1,  # replicated on all 8 devices: one read
      "verified_equal": True, "verified_query_reads": 1}
