"""Per-tensor checksums: written by every save, checked by every load; and
``checkpoints.verify`` for foreign checkpoints.

Byte flips inside tensor data load silently without a manifest (that is the
failure being fixed: the weights stay finite and the output is garbage), so
each case checks both: the flip changes the loaded weights when checks are
off, and the load fails, naming the tensor, when they are on.
"""

import glob
import json
import os
import shutil
import struct

import numpy as np
import pytest
import tensorstore as ts

from specdec_jax import checkpoints, models
from specdec_jax.checkpoints import checksums
from tests.checkpoints.helpers import tiny

PRESET = {"native": "gemma_tiny", "hf": "gemma2_tiny", "t5x": "t5_tiny",
          "t5x_orbax": "t5_tiny", "gemma": "gemma2_tiny"}


def _save(tmp_path, fmt):
  model, params = tiny(PRESET[fmt])
  path = str(tmp_path / fmt)
  checkpoints.save(path, model, params, format=fmt)
  return path, model, params


def _load(path, fmt, **kw):
  model = PRESET[fmt] if fmt in ("t5x", "t5x_orbax", "gemma") else None
  return checkpoints.load(path, model=model, dtype=None, **kw)[1]


def _changed(a, b) -> bool:
  fa, fb = models.flatten_params(a), models.flatten_params(b)
  return any(not np.array_equal(np.asarray(fa[k]), np.asarray(fb[k]))
             for k in fa)


def _safetensors_offsets(file):
  """{tensor: (start, end)} absolute byte ranges of a safetensors file."""
  with open(file, "rb") as f:
    (n,) = struct.unpack("<Q", f.read(8))
    header = json.loads(f.read(n))
  return {k: (8 + n + v["data_offsets"][0], 8 + n + v["data_offsets"][1])
          for k, v in header.items() if k != "__metadata__"}


def _flip(file, pos, bit=0x10):
  data = bytearray(open(file, "rb").read())
  data[pos] ^= bit
  with open(file, "wb") as f:
    f.write(bytes(data))


@pytest.mark.parametrize("fmt", sorted(PRESET))
def test_every_format_writes_a_manifest_that_loads(tmp_path, fmt):
  path, _, params = _save(tmp_path, fmt)
  step_dir = path
  manifest = checksums.read(os.path.join(step_dir, checksums.MANIFEST))
  flat = models.flatten_params(params)
  assert len(manifest.tensors) >= len(flat) - 1  # HF/Gemma may fuse leaves
  assert not _changed(_load(path, fmt), params)
  report = checkpoints.verify(path)
  assert report.ok and report.manifest == manifest.path
  assert {t.checksum for t in report.tensors} == {"ok"}


@pytest.mark.parametrize("fmt,file,name", [
    ("native", "params.safetensors", "layer_1/mlp/linear/kernel"),
    ("hf", "model.safetensors", "model.layers.1.mlp.down_proj.weight"),
])
def test_byte_flip_inside_a_safetensors_tensor(tmp_path, fmt, file, name):
  path, _, params = _save(tmp_path, fmt)
  target = os.path.join(path, file)
  start, end = _safetensors_offsets(target)[name]
  for pos in (start, (start + end) // 2, end - 1):
    copy = str(tmp_path / f"copy{pos}")
    shutil.copytree(path, copy)
    _flip(os.path.join(copy, file), pos)
    assert _changed(_load(copy, fmt, verify_checksums=False), params)
    with pytest.raises(checksums.ChecksumError) as e:
      _load(copy, fmt)
    assert str(e.value).startswith(
        f"tensor '{name}' in '{os.path.join(copy, file)}' fails its "
        f"checksum (sha256 ")
    assert "restore the checkpoint from a good copy" in str(e.value)
    report = checkpoints.verify(copy)
    assert not report.ok and [t.name for t in report.tensors
                              if t.checksum == "MISMATCH"] == [name]


def test_silently_changed_zarr_array_in_a_t5x_checkpoint(tmp_path):
  path, _, params = _save(tmp_path, "t5x")
  name = "target.decoder.layers_0.mlp.wo.kernel"
  store = ts.open({"driver": "zarr", "kvstore": {
      "driver": "file", "path": os.path.join(path, name)}}).result()
  arr = store.read().result()
  arr[0, 0] += 0.25  # a valid gzip chunk with other values
  store.write(arr).result()
  assert _changed(_load(path, "t5x", verify_checksums=False), params)
  with pytest.raises(checksums.ChecksumError,
                     match=r"^tensor 'target/decoder/layers_0/mlp/wo/kernel' "
                     r"in '.*target.decoder.layers_0.mlp.wo.kernel/' fails"):
    _load(path, "t5x")


@pytest.mark.parametrize("fmt", ["t5x_orbax", "gemma"])
def test_byte_flips_in_orbax_data(tmp_path, fmt):
  path, _, params = _save(tmp_path, fmt)
  files = [f for f in glob.glob(os.path.join(path, "**", "d", "*"),
                                recursive=True) if os.path.isfile(f)]
  big = max(files, key=os.path.getsize)
  size = os.path.getsize(big)
  silent = 0
  for pos in np.linspace(size // 8, size - size // 8, 5).astype(int):
    copy = str(tmp_path / f"copy{pos}")
    shutil.copytree(path, copy)
    _flip(os.path.join(copy, os.path.relpath(big, path)), int(pos))
    try:
      loaded = _load(copy, fmt, verify_checksums=False)
    except ValueError:
      continue  # the container noticed by itself
    if not _changed(loaded, params):
      continue
    silent += 1
    with pytest.raises(checksums.ChecksumError, match=r"^tensor '.+' in "
                       r"'.+' fails its checksum"):
      _load(copy, fmt)
  assert silent >= 1  # the case the manifest exists for was exercised


def test_manifest_problems_are_named(tmp_path):
  path, _, _ = _save(tmp_path, "native")
  file = os.path.join(path, checksums.MANIFEST)
  data = json.load(open(file))
  del data["tensors"]["final_norm/scale"]
  json.dump(data, open(file, "w"))
  with pytest.raises(checksums.ChecksumError, match=r"^tensor "
                     r"'final_norm/scale' in '.*params.safetensors' is not "
                     r"listed in the checksum manifest .*checksums.json"):
    _load(path, "native")
  open(file, "w").write("{not json")
  with pytest.raises(checksums.ChecksumError, match=r"checksums.json is not "
                     r"valid JSON"):
    _load(path, "native")
  _load(path, "native", verify_checksums=False)  # the escape hatch


def test_verify_foreign_checkpoint_without_manifest(tmp_path):
  model, params = tiny("gemma2_tiny")
  bad = dict(models.flatten_params(params))
  w = np.array(bad["final_norm/scale"])
  w[3] = np.nan
  bad["final_norm/scale"] = w
  bad["layer_0/mlp/linear/kernel"] = np.zeros_like(
      bad["layer_0/mlp/linear/kernel"])
  path = str(tmp_path / "hf")
  checkpoints.save(path, model, models.unflatten_params(bad), format="hf")
  os.remove(os.path.join(path, checksums.MANIFEST))  # as a foreign export
  report = checkpoints.verify(path)
  assert report.manifest is None and not report.ok
  assert report.problems == ["'model.norm.weight' has 1 NaN/inf value(s) of "
                             "32"]
  assert any("is all zeros" in w for w in report.warnings)
  norm = [t for t in report.tensors if t.name == "model.norm.weight"][0]
  assert norm.nonfinite == 1 and norm.checksum == "-" and np.isfinite(
      norm.mean)
  assert report.summary().startswith(f"1 PROBLEM(S): {path} (hf), 24 "
                                     f"tensors; checksums: none")
