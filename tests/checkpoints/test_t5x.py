"""T5X checkpoints: legacy msgpack + zarr, Orbax, errors, gs:// specs."""

import functools
import json
import os

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
import tensorstore as ts
from flax import serialization

from specdec_jax import models
from specdec_jax.checkpoints import t5x, t5x_write
from tests.checkpoints.helpers import assert_same, tiny

QUERY = "encoder/layers_0/attention/query/kernel"


def _flat(params):
  return {k: np.asarray(v) for k, v in models.flatten_params(params).items()}


@functools.lru_cache(maxsize=None)
def _forward(model):
  return jax.jit(model.forward)


def _logits(model, params):
  tokens = np.arange(12).reshape(2, 6) % model.vocab_size + 2
  return np.asarray(_forward(model)(params, tokens[:, :4], inputs=tokens))


def test_chunk_shape_follows_t5x():
  # t5x legacy test: [8192, 8192] f32 written as [4096, 8192] per host.
  assert t5x_write.chunk_shape((4096, 8192), 16 * 2**20) == [4096, 4096]
  assert t5x_write.chunk_shape((2, 8), 16 * 2**20) == [2, 8]
  # Embedding of T5 v1.1 XXL: 32128 = 2^7 * 251; halve the largest dim.
  assert t5x_write.chunk_shape((32128, 4096), 16 * 2**20) == [4016, 4096]
  assert t5x_write.chunk_shape((32128, 4096), 32 * 2**20) == [8032, 4096]
  assert t5x_write.chunk_shape((), 10) == []


def test_legacy_layout_is_the_t5x_one(tmp_path):
  model, params = tiny("t5_tiny")
  path = tmp_path / "checkpoint_7"
  t5x_write.save_t5x(str(path), params, step=7)
  assert t5x.detect_t5x_format(str(path)) == "t5x"
  assert t5x.detect_t5x_format(str(tmp_path)) == "t5x"  # the model dir
  contents = serialization.msgpack_restore((path / "checkpoint").read_bytes())
  assert set(contents) == {"version", "optimizer"}
  assert contents["version"] == 3
  state = contents["optimizer"]["state"]
  assert state["step"].dtype == np.int32 and state["step"] == 7
  assert state["param_states"] == {}
  spec = contents["optimizer"]["target"]["encoder"]["layers_0"]["attention"][
      "query"]["kernel"]
  assert spec == {
      "driver": "zarr", "dtype": "float32",
      "kvstore": {"driver": "file",
                  "path": "target.encoder.layers_0.attention.query.kernel/"},
      "metadata": {"chunks": [32, 32], "compressor": {"id": "gzip",
                                                      "level": 1},
                   "shape": [32, 32]}}
  zdir = path / "target.encoder.layers_0.attention.query.kernel"
  assert sorted(os.listdir(zdir)) == [".zarray", "0.0"]
  zarray = json.loads((zdir / ".zarray").read_text())
  assert zarray["compressor"] == {"id": "gzip", "level": 1}
  assert zarray["dtype"] == "<f4" and zarray["shape"] == [32, 32]
  stored = ts.open({"driver": "zarr", "kvstore": {
      "driver": "file", "path": str(zdir)}}).result().read().result()
  np.testing.assert_array_equal(stored, _flat(params)[QUERY])
  # Every leaf has its own TensorStore; besides them only the msgpack and
  # our checksum manifest (which t5x ignores).
  names = sorted(os.listdir(path))
  assert names == sorted(["checkpoint", "checksums.json"] + [
      "target." + k.replace("/", ".") for k in _flat(params)])
  with pytest.raises(ValueError, match="already exists"):
    t5x_write.save_t5x(str(path), params)


def _write_by_hand(path, params):
  """A legacy checkpoint written directly with TensorStore + msgpack, in the
  older spec variants t5x has produced: gfile and dummy-bucket gcs kvstores,
  paths without the trailing '/', several chunks, and an inline leaf."""
  os.makedirs(path)
  target = {}
  for i, (name, arr) in enumerate(sorted(_flat(params).items())):
    if name == "decoder/relpos_bias/rel_embedding":
      target[name] = arr  # inline in the msgpack
      continue
    rel = "target." + name.replace("/", ".")
    chunks = [max(1, n // 2) for n in arr.shape]
    ts.open({"driver": "zarr", "kvstore": {
        "driver": "file", "path": os.path.join(path, rel)},
             "metadata": {"shape": list(arr.shape), "chunks": chunks,
                          "dtype": "<f4", "compressor": {"id": "gzip"}}},
            create=True).result().write(arr).result()
    meta = {"chunks": chunks, "compressor": {"id": "gzip", "level": 1},
            "shape": list(arr.shape)}
    if i % 3 == 0:
      target[name] = {"driver": "zarr", "dtype": "float32", "metadata": meta,
                      "kvstore": {"driver": "gfile", "path": rel}}
    elif i % 3 == 1:
      target[name] = {"driver": "zarr", "dtype": "float32", "metadata": meta,
                      "kvstore": {"driver": "gcs",
                                  "bucket": "t5x-dummy-bucket"},
                      "path": rel + "/"}
    else:
      target[name] = {"driver": "zarr", "dtype": "float32", "metadata": meta,
                      "kvstore": {"driver": "file", "path": rel + "/"}}
  contents = {"version": 3, "optimizer": {
      "target": models.unflatten_params(target),
      "state": {"step": np.int32(100), "param_states": {}}}}
  with open(os.path.join(path, "checkpoint"), "wb") as f:
    f.write(serialization.msgpack_serialize(contents))


def test_reads_hand_written_legacy_checkpoint(tmp_path):
  model, params = tiny("t5_tiny")
  _write_by_hand(str(tmp_path / "checkpoint_100"), params)
  got = t5x.load_t5x(str(tmp_path), model, dtype="float32")
  assert_same(got, params)
  np.testing.assert_array_equal(_logits(model, got), _logits(model, params))
  # bfloat16 restore is the rounded float32 (TensorStore cast == numpy's).
  bf16 = t5x.load_t5x(str(tmp_path / "checkpoint_100" / "checkpoint"), model)
  assert_same(bf16, jax.tree.map(lambda x: x.astype("bfloat16"), params))
  tree = t5x.load_t5x_tree(str(tmp_path))
  assert isinstance(tree["encoder"]["encoder_norm"]["scale"], np.ndarray)
  assert_same(tree, params)


@pytest.mark.filterwarnings("ignore:Sharding info not provided")
def test_orbax_layout_round_trip(tmp_path):
  model, params = tiny("t5_tiny")
  path = tmp_path / "checkpoint_3"
  t5x_write.save_t5x(str(path), params, step=3, layout="orbax")
  assert (path / "state" / "_METADATA").is_file()
  assert (path / "_CHECKPOINT_METADATA").is_file()
  assert t5x.detect_t5x_format(str(path)) == "orbax"
  # Read back with Orbax itself: {'target', 'state': {'step'}} under state/.
  raw = ocp.PyTreeCheckpointer().restore(str(path / "state"))
  assert int(raw["state"]["step"]) == 3
  np.testing.assert_array_equal(raw["target"]["encoder"]["layers_0"][
      "attention"]["query"]["kernel"], _flat(params)[QUERY])
  assert_same(t5x.load_t5x(str(path), model, dtype=None), params)
  assert_same(t5x.load_t5x_tree(str(tmp_path), dtype="bfloat16"),
               jax.tree.map(lambda x: x.astype("bfloat16"), params))


def test_sharding_single_and_callable(tmp_path):
  model, params = tiny("t5_tiny")
  t5x_write.save_t5x(str(tmp_path / "checkpoint_1"), params)
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("model",))
  row = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("model"))
  got = t5x.load_t5x(str(tmp_path), model, dtype="float32", sharding=row)
  assert all(x.sharding == row for x in jax.tree.leaves(got))
  assert_same(got, params)
  calls = []

  def by_leaf(path, shape):
    calls.append((path, shape))
    spec = (None, "model") if path.endswith("kernel") else ()
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec))

  got = t5x.load_t5x(str(tmp_path), model, dtype="float32", sharding=by_leaf)
  assert dict(calls) == {k: v.shape for k, v in _flat(params).items()}
  assert got["encoder"]["layers_0"]["attention"]["query"]["kernel"].sharding \
      .spec == jax.sharding.PartitionSpec(None, "model")
  assert_same(got, params)


def test_merged_checkpoint_subtrees(tmp_path):
  model, draft = tiny("t5_tiny", seed=1)
  _, target = tiny("t5_tiny", seed=2)
  path = str(tmp_path / "checkpoint_5")
  t5x_write.save_t5x(path, {"draft": draft, "target": target}, step=5)
  assert (tmp_path / "checkpoint_5" /
          "target.draft.encoder.layers_0.attention.query.kernel").is_dir()
  assert_same(t5x.load_t5x(path, model, "float32", subtree="target/draft"),
               draft)
  assert_same(t5x.load_t5x(path, model, "float32", subtree="target/target"),
               target)
  assert sorted(t5x.load_t5x_tree(path)) == ["draft", "target"]
  with pytest.raises(ValueError, match=(
      r"no subtree 'target/verifier': no 'verifier' under 'target' \(found "
      r"\['draft', 'target'\]\)")):
    t5x.load_t5x(path, model, subtree="target/verifier")
  # The merged tree is not one model's tree.
  with pytest.raises(ValueError, match="is missing 52 leaf/leaves"):
    t5x.load_t5x(path, model)


def test_missing_empty_and_tf_checkpoints(tmp_path):
  model, _ = tiny("t5_tiny")
  with pytest.raises(ValueError, match="does not exist"):
    t5x.load_t5x(str(tmp_path / "nope"), model)
  with pytest.raises(ValueError, match="is empty"):
    t5x.detect_t5x_format(str(tmp_path))
  (tmp_path / "other.txt").write_text("x")
  with pytest.raises(ValueError, match="no checkpoint in .*checkpoint_<step>"):
    t5x.load_t5x(str(tmp_path), model)
  tf_dir = tmp_path / "tf"
  tf_dir.mkdir()
  (tf_dir / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-0"\n')
  assert t5x.detect_t5x_format(str(tf_dir)) == "t5x_tf"
  with pytest.raises(ValueError, match="TensorFlow .* not supported: convert"):
    t5x.load_t5x(str(tf_dir), model)


@pytest.fixture(name="ckpt")
def _ckpt(tmp_path):
  _, params = tiny("t5_tiny")
  t5x_write.save_t5x(str(tmp_path / "checkpoint_1"), params)
  return tmp_path / "checkpoint_1"


def _edit_msgpack(path, fn):
  file = path / "checkpoint"
  contents = serialization.msgpack_restore(file.read_bytes())
  fn(contents["optimizer"]["target"])
  file.write_bytes(serialization.msgpack_serialize(contents))


def test_wrong_preset_and_missing_leaf(ckpt):
  wide, _ = tiny("t5_tiny", mlp_dim=48)
  with pytest.raises(ValueError, match=(
      r"leaf 'decoder/layers_0/mlp/wi_0/kernel' has shape \(32, 64\), "
      r"expected \(32, 48\)")):
    t5x.load_t5x(str(ckpt), wide)
  with pytest.raises(ValueError, match="T5X checkpoints hold T5 models"):
    t5x.load_t5x(str(ckpt), "gemma_tiny")
  model, _ = tiny("t5_tiny")
  _edit_msgpack(ckpt, lambda t: t["decoder"]["layers_1"]["mlp"].pop("wo"))
  with pytest.raises(ValueError, match=(
      r"missing 1 leaf/leaves, first: 'decoder/layers_1/mlp/wo/kernel' "
      r"\(expected shape \(64, 32\)\)")):
    t5x.load_t5x(str(ckpt), model)


def test_corrupt_zarr_arrays(ckpt):
  model, _ = tiny("t5_tiny")
  zdir = ckpt / "target.encoder.layers_0.attention.query.kernel"
  chunk = (zdir / "0.0").read_bytes()
  (zdir / "0.0").write_bytes(chunk[:len(chunk) // 2])
  with pytest.raises(ValueError, match=(
      r"cannot read 'encoder/layers_0/attention/query/kernel' from zarr array "
      r".*target.encoder.layers_0.attention.query.kernel/.*truncated")):
    t5x.load_t5x(str(ckpt), model)
  (zdir / "0.0").unlink()  # a missing chunk is an error, not zeros
  with pytest.raises(ValueError, match=r"cannot read .*chunk \{0, 0\}.* is "
                     "missing"):
    t5x.load_t5x(str(ckpt), model)
  (zdir / "0.0").write_bytes(chunk)
  zarray = json.loads((zdir / ".zarray").read_text())
  (zdir / ".zarray").write_text(json.dumps({**zarray, "dtype": "<i4"}))
  with pytest.raises(ValueError, match=(
      r"'encoder/layers_0/attention/query/kernel'.*dtype from metadata "
      r"\(int32\) does not match dtype in schema \(float32\)")):
    t5x.load_t5x(str(ckpt), model)
  (zdir / ".zarray").write_text(json.dumps(zarray))
  _edit_msgpack(ckpt, lambda t: t["encoder"]["encoder_norm"].update(
      scale=np.arange(32, dtype=np.int32)))
  with pytest.raises(ValueError, match=(
      "'encoder/encoder_norm/scale' .* is stored as int32, not a "
      "floating-point type")):
    t5x.load_t5x(str(ckpt), model)
  data = (ckpt / "checkpoint").read_bytes()
  (ckpt / "checkpoint").write_bytes(data[:len(data) // 2])
  with pytest.raises(ValueError, match="not a valid T5X msgpack checkpoint"):
    t5x.load_t5x(str(ckpt), model)


def test_gcs_paths_pass_through_to_tensorstore():
  arr = np.zeros((4, 6), np.float32)
  spec = t5x_write.relative_spec("target/x/kernel", arr, gcs=True)
  assert spec["kvstore"] == {"driver": "gcs", "bucket": "t5x-dummy-bucket",
                             "path": "target.x.kernel/"}
  read = t5x.absolute_spec(spec, "gs://my-bucket/runs/t5/checkpoint_5")
  assert read == {"driver": "zarr", "dtype": "float32",
                  "kvstore": {"driver": "gcs", "bucket": "my-bucket",
                              "path": "runs/t5/checkpoint_5/target.x.kernel/"},
                  "metadata": {"shape": [4, 6]}}
  # A checkpoint written locally and copied to GCS (and back).
  local = t5x_write.relative_spec("target/x/kernel", arr)
  assert t5x.absolute_spec(local, "gs://b/c")["kvstore"] == {
      "driver": "gcs", "bucket": "b", "path": "c/target.x.kernel/"}
  assert t5x.absolute_spec(spec, "/data/c")["kvstore"] == {
      "driver": "file", "path": "/data/c/target.x.kernel/"}
