"""Foreign checkpoints (no checksum manifest): the value guard on every load,
the checksum sidecar recorded on the first load, the HF index path check."""

import json
import os
import struct

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from specdec_jax import checkpoints, models
from specdec_jax.checkpoints import checksums, hf, leaves
from tests.checkpoints.helpers import tiny


@pytest.fixture(name="foreign")
def _foreign(tmp_path):
  """An HF export without its checksums.json: a checkpoint from elsewhere."""
  hf.save_hf(str(tmp_path), *tiny("gemma_tiny"))
  os.remove(tmp_path / "checksums.json")
  return tmp_path


def _put(path, name, arr):
  tensors = load_file(path / hf.SINGLE)
  tensors[name] = arr
  save_file(tensors, path / hf.SINGLE, metadata={"format": "pt"})


@pytest.mark.parametrize("value,match", [
    (1e5, r"tensor 'final_norm/scale' holds \|x\| = 1e\+05, beyond the "
     r"plausible bound 10000 for model weights; the checkpoint is corrupt "
     r"\(e.g. a flipped exponent bit\) or not model weights: restore it from "
     r"a good copy \(or pass check_values=False to load it anyway\)"),
    (np.nan, r"tensor 'final_norm/scale' holds 1 NaN/inf value\(s\) \(first "
     r"at flat index 3\)"),
])
def test_implausible_values_are_refused_naming_the_tensor(foreign, value,
                                                          match):
  norm = load_file(foreign / hf.SINGLE)["model.norm.weight"].copy()
  norm[3] = value
  _put(foreign, "model.norm.weight", norm)
  with pytest.raises(ValueError, match=match):
    checkpoints.load(str(foreign), dtype="float32")
  _, params = checkpoints.load(str(foreign), dtype="float32",
                               check_values=False)  # the opt-out
  got = np.asarray(params["final_norm"]["scale"])[3]
  assert np.isnan(got) if np.isnan(value) else got == value


def test_gemma3_norm_scales_of_1e3_are_plausible():
  leaves.check_values("x", np.full((4,), 1.19e3, np.float32), "ckpt")


def _flip_mid_tensor(path, name):
  """Flips the lowest mantissa byte of the middle element of ``name``."""
  data = bytearray((path / hf.SINGLE).read_bytes())
  n = struct.unpack("<Q", data[:8])[0]
  header = json.loads(data[8:8 + n])
  start, end = header[name]["data_offsets"]
  mid = 8 + n + start + ((end - start) // 8) * 4  # an element boundary
  data[mid] ^= 0x01
  (path / hf.SINGLE).write_bytes(bytes(data))


def test_a_flipped_byte_is_caught_by_the_sidecar_of_the_first_load(foreign):
  name = "model.layers.0.mlp.up_proj.weight"
  _, first = checkpoints.load(str(foreign), dtype="float32")
  sidecar = checksums.sidecar_path(str(foreign))
  assert os.path.exists(sidecar)
  checkpoints.load(str(foreign), dtype="float32")  # unchanged: loads
  _flip_mid_tensor(foreign, name)
  with pytest.raises(checksums.ChecksumError, match=(
      r"tensor 'layer_0/mlp/.*' in .* fails its checksum .* \[checksums "
      r"recorded on its first load in the sidecar .*; if you replaced the "
      r"checkpoint on purpose, delete that file\]")):
    checkpoints.load(str(foreign), dtype="float32")
  _, again = checkpoints.load(str(foreign), dtype="float32",
                              verify_checksums=False)
  # The value guard alone cannot see it: one weight moved by ~1e-7.
  a, b = models.flatten_params(first), models.flatten_params(again)
  changed = sum(int((np.asarray(a[k]) != np.asarray(b[k])).sum()) for k in a)
  assert changed == 1


@pytest.mark.parametrize("target", ["/etc/passwd", "../model.safetensors",
                                    "sub/../../x.safetensors"])
def test_hf_index_may_only_name_files_next_to_it(foreign, target):
  (foreign / hf.INDEX).write_text(json.dumps(
      {"weight_map": {"model.norm.weight": target}}))
  with pytest.raises(ValueError, match=(
      f"names the weight file '{target}', which is not a file of the "
      f"checkpoint directory")):
    checkpoints.load(str(foreign))
