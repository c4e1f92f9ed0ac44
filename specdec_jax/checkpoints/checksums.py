"""Per-tensor checksum manifests: written with every checkpoint we save,
checked on every load.

A manifest is ``checksums.json`` in the checkpoint directory::

    {"format": "specdec_jax-checksums", "version": 1, "algorithm": "sha256",
     "tensors": {"<stored name>": {"sha256": "9f86...", "shape": [4, 8],
                                   "dtype": "bfloat16"}, ...}}

The digest is SHA-256 of the tensor's C-order bytes in its STORED dtype (the
bytes a reader gets back before any cast), so a flipped byte anywhere inside
a tensor's data is caught however the container encodes it (safetensors,
zarr chunks, Orbax/OCDBT). Stored names are the container's own:

    native     the leaf path in params.safetensors ('decoder/layers_0/...')
    hf         the HF tensor name ('model.layers.0.mlp.up_proj.weight')
    t5x        the state path ('target/encoder/layers_0/...'), legacy and
               Orbax alike (the manifest sits in the step directory)
    gemma      the Orbax keys joined by '/' ('transformer/layer_0/attn/...')

Checkpoints without a manifest (foreign ones, or written before manifests
existed) load as before; :func:`specdec_jax.checkpoints.verify` checks them
for finiteness and plausible statistics instead.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Iterable, Mapping

import numpy as np
from etils import epath

MANIFEST = "checksums.json"
FORMAT = "specdec_jax-checksums"
VERSION = 1
_SKIP_HINT = ("restore the checkpoint from a good copy (or pass "
              "verify_checksums=False to load it anyway)")


class ChecksumError(ValueError):
  """A tensor's bytes do not match the checkpoint's checksum manifest."""


def digest(arr) -> str:
  """SHA-256 (hex) of an array's C-order bytes, in its own dtype.

  Args:
    arr: any array-like (numpy, jax); its dtype is the stored dtype.

  Returns:
    64 hex characters.
  """
  a = np.ascontiguousarray(np.asarray(arr))
  h = hashlib.sha256()
  flat = a.reshape(-1).view(np.uint8) if a.size else a.reshape(-1)
  step = 1 << 26  # 64 MiB at a time: no full extra copy of a huge tensor
  for i in range(0, flat.size, step):
    h.update(memoryview(flat[i:i + step]))
  return h.hexdigest()


def entry(arr) -> dict:
  """The manifest entry of one stored tensor."""
  a = np.asarray(arr)
  return {"sha256": digest(a), "shape": list(a.shape),
          "dtype": np.dtype(a.dtype).name}


class Manifest:
  """The checksums of one checkpoint.

  Attributes:
    path: the manifest file.
    tensors: {stored name: {'sha256', 'shape', 'dtype'}}.
  """

  def __init__(self, path: str, tensors: Mapping[str, Mapping]):
    self.path = str(path)
    self.tensors = dict(tensors)

  def __contains__(self, name: str) -> bool:
    return name in self.tensors

  def check(self, name: str, arr, where: str = "") -> None:
    """Raises ChecksumError unless ``arr`` is the tensor ``name`` as saved.

    Args:
      name: stored name (see the module docstring).
      arr: the tensor as read, in its stored dtype.
      where: the file or directory it was read from, for the message.
    """
    src = f" in {where}" if where else ""
    if name not in self.tensors:
      raise ChecksumError(f"tensor '{name}'{src} is not listed in the "
                          f"checksum manifest {self.path}; the checkpoint was "
                          f"changed after it was saved: {_SKIP_HINT}")
    want = self.tensors[name]
    a = np.asarray(arr)
    if list(a.shape) != list(want.get("shape", a.shape)) or (
        np.dtype(a.dtype).name != want.get("dtype", np.dtype(a.dtype).name)):
      raise ChecksumError(
          f"tensor '{name}'{src} is {np.dtype(a.dtype).name}{list(a.shape)} "
          f"but was saved as {want.get('dtype')}{want.get('shape')} "
          f"({self.path}): {_SKIP_HINT}")
    got = digest(a)
    if got != want["sha256"]:
      raise ChecksumError(
          f"tensor '{name}'{src} fails its checksum (sha256 {got[:12]}..., "
          f"saved as {want['sha256'][:12]}...): its bytes changed after it "
          f"was saved (a corrupt or partial copy); {_SKIP_HINT}")


def write(directory: str, tensors: Mapping[str, Mapping],
          name: str = MANIFEST) -> str:
  """Writes ``checksums.json`` (atomically) into ``directory``.

  Args:
    directory: the checkpoint directory.
    tensors: {stored name: :func:`entry` dict}.
    name: the file name (a sidecar's differs).

  Returns:
    The manifest path.
  """
  body = json.dumps({"format": FORMAT, "version": VERSION,
                     "algorithm": "sha256",
                     "tensors": dict(sorted(tensors.items()))}, indent=1)
  d = epath.Path(directory)
  d.mkdir(parents=True, exist_ok=True)
  tmp, final = d / (name + ".tmp"), d / name
  tmp.write_text(body + "\n")
  tmp.rename(final)
  return str(final)


def cache_root() -> str:
  """specdec_jax's per-user cache directory: ``$SPECDEC_JAX_CACHE``, else
  ``~/.cache/specdec_jax`` (sidecars, the compilation cache)."""
  return os.environ.get("SPECDEC_JAX_CACHE") or os.path.join(
      os.path.expanduser("~"), ".cache", "specdec_jax")


def sidecar_path(source: str) -> str:
  """The sidecar of a checkpoint without a manifest (a foreign one).

  Its checksums are recorded on the first successful load (keyed by OUR leaf
  paths, digests of each leaf as read in its stored dtype) in the per-user
  cache, never in the checkpoint's own directory (it may be read-only, a
  shared download cache or gs://): ``<cache_root>/checksums/<hash of the
  absolute path>.json``.
  """
  where = str(source)
  if "://" not in where:
    where = os.path.realpath(where.split(":")[0]) + where[len(
        where.split(":")[0]):]
  key = hashlib.sha256(where.encode()).hexdigest()[:24]
  return os.path.join(cache_root(), "checksums", f"{key}.json")


def write_arrays(directory: str, arrays: Iterable[tuple[str, object]]) -> str:
  """:func:`write` for ``(stored name, array)`` pairs."""
  return write(directory, {name: entry(arr) for name, arr in arrays})


def read(path: str) -> Manifest:
  """Parses a manifest file (errors name the file)."""
  p = epath.Path(path)
  try:
    data = json.loads(p.read_text())
  except (ValueError, UnicodeDecodeError) as e:
    raise ChecksumError(f"checksum manifest {path} is not valid JSON ({e}); "
                        f"{_SKIP_HINT}") from None
  if not isinstance(data, dict) or data.get("format") != FORMAT or (
      not isinstance(data.get("tensors"), dict)):
    raise ChecksumError(f"{path} is not a specdec_jax checksum manifest "
                        f"(expected format {FORMAT!r} with a 'tensors' map); "
                        f"{_SKIP_HINT}")
  if data.get("algorithm", "sha256") != "sha256":
    raise ChecksumError(f"{path}: unsupported checksum algorithm "
                        f"{data.get('algorithm')!r} (expected 'sha256')")
  return Manifest(str(path), data["tensors"])


def find(*directories: str) -> Manifest | None:
  """The manifest in the first of ``directories`` that has one, else None."""
  for d in directories:
    if d is None:
      continue
    p = epath.Path(d) / MANIFEST
    if p.exists():
      return read(str(p))
  return None


def remove(directory: str) -> None:
  """Deletes an old manifest before a checkpoint is rewritten in place."""
  p = epath.Path(directory) / MANIFEST
  if p.exists():
    p.unlink()


def flatten_keys(tree: Mapping, prefix: tuple[str, ...] = ()):
  """(key tuple, leaf) of every leaf of a nested dict, sorted."""
  for key in sorted(tree):
    val = tree[key]
    if isinstance(val, Mapping):
      yield from flatten_keys(val, prefix + (str(key),))
    elif val is not None:
      yield prefix + (str(key),), val


__all__ = ["ChecksumError", "MANIFEST", "Manifest", "cache_root", "digest",
           "entry", "find", "flatten_keys", "read", "remove", "sidecar_path",
           "write", "write_arrays"]
