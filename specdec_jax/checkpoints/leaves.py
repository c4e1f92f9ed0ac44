"""The leaf machinery every checkpoint reader shares: :class:`Leaf` (one
tensor of OUR tree, not yet read), :func:`restore` (check names, shapes and
dtypes against the model, then read, check, cast and place the leaves one at
a time), the Orbax leaf reader, and the plausibility guard on every value.

The format modules (``hf.py``, ``t5x.py``, ``gemma_official.py``) import
this module and ``loader.py`` imports them, so there is no import circle.
See ``loader.py`` for the formats and ``docs/checkpoints.md`` for what the
checks can and cannot detect.
"""

from __future__ import annotations

import dataclasses
import math
import os
import warnings
from typing import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from specdec_jax import models
from specdec_jax.checkpoints import checksums
from specdec_jax.models import families

ShardingFn = Callable[[str, tuple[int, ...]], jax.sharding.Sharding]
# None (default device), one Sharding for every leaf, or fn(path, shape).
ShardingArg = jax.sharding.Sharding | ShardingFn | None
Index = tuple[slice, ...]

PROGRESS_BYTES = 200 * 1024 * 1024  # auto progress bar above this size


@dataclasses.dataclass(frozen=True)
class Leaf:
  """One leaf of OUR parameter tree in a checkpoint, not yet read.

  Attributes:
    path: '/'-joined path in our parameter tree.
    shape: shape of the leaf in our layout.
    dtype: dtype stored in the checkpoint.
    read: ``read(dtype, index)`` -> np.ndarray of the leaf (``index`` None)
      or of ``leaf[index]``, preferably cast to ``dtype`` already (None: the
      stored dtype). Only ``sliced`` leaves are asked for slices.
    source: what it is read from, for error messages.
    sliced: ``read`` reads only the requested slice (TensorStore), so each
      device shard is read on its own; otherwise the whole leaf is read once.
  """

  path: str
  shape: tuple[int, ...]
  dtype: np.dtype
  read: Callable[[np.dtype | None, Index | None], np.ndarray]
  source: str
  sliced: bool = False


def target_dtype(dtype) -> np.dtype | None:
  """'bfloat16' / 'float32' / None (keep the stored dtype) -> np.dtype."""
  if dtype is None:
    return None
  try:
    dt = jnp.dtype(dtype)
  except TypeError:
    raise ValueError(f"unknown dtype {dtype!r}; use 'bfloat16', 'float32' or "
                     f"None (keep the stored dtype)") from None
  if not jnp.issubdtype(dt, jnp.floating):
    raise ValueError(f"dtype must be a floating-point type such as "
                     f"'bfloat16' or 'float32', got {dtype!r}")
  return dt


def leaf_sharding(sharding: ShardingArg, path: str,
                  shape: tuple[int, ...]) -> jax.sharding.Sharding | None:
  """The sharding of one leaf (see the module docstring)."""
  if sharding is None or isinstance(sharding, jax.sharding.Sharding):
    return sharding
  if not callable(sharding):
    raise ValueError(f"sharding must be None, a jax.sharding.Sharding or a "
                     f"callable (path, shape) -> Sharding, got "
                     f"{type(sharding).__name__}")
  out = sharding(path, tuple(shape))
  if not isinstance(out, jax.sharding.Sharding):
    raise ValueError(f"sharding({path!r}, {tuple(shape)}) returned "
                     f"{type(out).__name__}, expected a jax.sharding.Sharding")
  return out


class _ReadError(ValueError):
  """A leaf could not be read (raised through jax's placement callbacks)."""


def _slice_shape(shape: tuple[int, ...], index: Index | None):
  if index is None:
    return tuple(shape)
  return tuple(len(range(*s.indices(n))) for s, n in zip(index, shape))


def read_leaf(leaf: Leaf, dtype, what: str, index: Index | None = None
              ) -> np.ndarray:
  """Reads ``leaf`` (or ``leaf[index]``) as ``dtype``; errors name the leaf."""
  try:
    arr = np.asarray(leaf.read(dtype, index))
  except checksums.ChecksumError:
    raise  # names the tensor and the file already
  except Exception as e:  # TensorStore, Orbax and safetensors errors alike
    raise _ReadError(f"{what}: cannot read '{leaf.path}' from {leaf.source}: "
                     f"{e}; the checkpoint is truncated or corrupt") from e
  want = _slice_shape(leaf.shape, index)
  if arr.shape != want:
    raise _ReadError(f"{what}: {leaf.source} gave shape {arr.shape} for "
                     f"'{leaf.path}', expected {want}")
  if dtype is not None and arr.dtype != dtype:
    arr = arr.astype(dtype)
  return arr


MAX_ABS = 1e4
"""The plausibility bound on every weight: trained weights are far smaller
(the largest we know are Gemma 3 270M's post-FFW norm scales, 1.19e3), while
a flipped exponent bit in a float32 / bfloat16 gives 1e5 to 1e38."""


def check_values(path: str, arr: np.ndarray, what: str) -> None:
  """Raises ValueError naming ``path`` unless ``arr`` is finite and every
  |x| <= :data:`MAX_ABS` (checked in chunks: no full float32 copy)."""
  flat = np.asarray(arr).reshape(-1)
  step = 1 << 24
  for i in range(0, flat.size, step):
    part = flat[i:i + step].astype(np.float32)
    finite = np.isfinite(part)
    if not finite.all():
      raise ValueError(
          f"{what}: tensor '{path}' holds {int((~finite).sum())} NaN/inf "
          f"value(s) (first at flat index {i + int(np.argmin(finite))}); the "
          f"checkpoint is corrupt: restore it from a good copy (or pass "
          f"check_values=False to load it anyway)")
    big = float(np.abs(part).max()) if part.size else 0.0
    if big > MAX_ABS:
      raise ValueError(
          f"{what}: tensor '{path}' holds |x| = {big:.3g}, beyond the "
          f"plausible bound {MAX_ABS:g} for model weights; the checkpoint is "
          f"corrupt (e.g. a flipped exponent bit) or not model weights: "
          f"restore it from a good copy (or pass check_values=False to load "
          f"it anyway)")


def _place(leaf: Leaf, dtype, sharding: ShardingArg, what: str,
           check: bool = False, host: np.ndarray | None = None) -> jax.Array:
  """Reads one leaf (unless ``host`` holds it already), checks its values
  when ``check``, and puts it on device(s)."""
  s = leaf_sharding(sharding, leaf.path, leaf.shape)
  if host is None and (s is None or not leaf.sliced):
    host = read_leaf(leaf, dtype, what)
  if host is not None and check:
    check_values(leaf.path, host, what)
  if s is None:
    return jax.device_put(host)
  if host is None:
    shards = {}  # replicated shards are read once

    def callback(index):
      key = tuple((sl.start, sl.stop, sl.step) for sl in index)
      if key not in shards:
        shards[key] = read_leaf(leaf, dtype, what, tuple(index))
        if check:
          check_values(leaf.path, shards[key], what)
      return shards[key]
  else:

    def callback(index):
      return host[index]
  try:
    return jax.make_array_from_callback(tuple(leaf.shape), s, callback)
  except (_ReadError, checksums.ChecksumError):
    raise
  except ValueError as e:
    if str(e).startswith(what):  # check_values inside the callback
      raise
    raise ValueError(f"{what}: cannot place '{leaf.path}' {tuple(leaf.shape)} "
                     f"with sharding {s}: {e}") from e


def _progress_bar(progress: bool | None, total: int, desc: str):
  show = total > PROGRESS_BYTES if progress is None else bool(progress)
  return tqdm.tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024,
                   desc=desc, disable=not show, leave=False)


def restore(leaves: Sequence[Leaf], model, *, dtype="bfloat16",
            sharding: ShardingArg = None, progress: bool | None = None,
            source: str = "checkpoint", check: bool = True,
            sidecar: str | None = None) -> dict:
  """Checks ``leaves`` against ``model``, then reads and places them one by one.

  Args:
    leaves: every leaf of the checkpoint, in our layout.
    model: the T5Model / GemmaModel the parameters are for.
    dtype: dtype of the restored leaves ('bfloat16', 'float32'; None keeps
      the stored dtype).
    sharding: see the module docstring.
    progress: show a progress bar (None: only above ~200 MB).
    source: the checkpoint path, for messages.
    check: check every value (finite, |x| <= :data:`MAX_ABS`), naming the
      first implausible tensor.
    sidecar: a checkpoint without a checksum manifest (a foreign one): the
      sidecar file (``checksums.sidecar_path``) its per-leaf checksums are
      checked against, or recorded into on this first successful load.

  Returns:
    Nested parameter dict of jax.Arrays.

  Raises:
    ValueError naming the first missing, unexpected, wrong-shape, non-float,
    unreadable or implausible leaf; ``checksums.ChecksumError`` naming a leaf
    that differs from its sidecar.
  """
  dt = target_dtype(dtype)
  what = f"checkpoint {source!r}"
  shapes = {leaf.path: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype)
            for leaf in leaves}
  models.check_params(models.unflatten_params(shapes), model.param_shapes(),
                      what=what)
  for leaf in leaves:
    if not jnp.issubdtype(leaf.dtype, jnp.floating):
      raise ValueError(f"{what}: '{leaf.path}' ({leaf.source}) is stored as "
                       f"{np.dtype(leaf.dtype).name}, not a floating-point "
                       f"type; the checkpoint is corrupt or not model weights")
  sizes = [math.prod(leaf.shape) * np.dtype(dt or leaf.dtype).itemsize
           for leaf in leaves]
  known = record = None
  if sidecar is not None:
    known = checksums.read(sidecar) if os.path.exists(sidecar) else None
    record = {} if known is None else None
  flat = {}
  desc = f"loading {os.path.basename(str(source).rstrip('/'))}"
  with _progress_bar(progress, sum(sizes), desc) as bar:
    for leaf, size in zip(leaves, sizes):
      host = None
      if sidecar is not None:  # whole leaf, stored dtype, then cast
        host = read_leaf(leaf, None, what)
        if known is not None:
          _check_sidecar(known, leaf.path, host, source)
        else:
          record[leaf.path] = checksums.entry(host)
        if dt is not None and host.dtype != dt:
          host = host.astype(dt)
      flat[leaf.path] = _place(leaf, dt, sharding, what, check, host)
      bar.update(size)
  params = models.unflatten_params(flat)
  model.check_params(params)
  if record is not None:
    _write_sidecar(sidecar, record)
  return params


def _check_sidecar(known: checksums.Manifest, path: str, arr, source: str):
  try:
    known.check(path, arr, repr(str(source)))
  except checksums.ChecksumError as e:
    raise checksums.ChecksumError(
        f"{e} [checksums recorded on its first load in the sidecar "
        f"{known.path}; if you replaced the checkpoint on purpose, delete "
        f"that file]") from None


def _write_sidecar(sidecar: str, record: dict) -> None:
  directory, name = os.path.split(sidecar)
  try:
    checksums.write(directory, record, name=name)
  except OSError as e:
    warnings.warn(f"could not record the checkpoint's checksums in {sidecar} "
                  f"({e}); later corruption of it will not be detected")


# ----------------------------------------------------------------------------
# Orbax
# ----------------------------------------------------------------------------


class OrbaxReader:
  """Reads single leaves of an Orbax PyTree checkpoint (OCDBT or not).

  Attributes:
    directory: the checkpoint item directory (holding ``_METADATA``).
    tree: nested dict of Orbax value metadata (``.shape``, ``.dtype``).
    manifest: checksums checked on every read (None: no check); a leaf's
      stored name is its keys joined by '/'.
  """

  def __init__(self, directory: str,
               manifest: checksums.Manifest | None = None):
    import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
    self._ocp = ocp
    self.manifest = manifest
    self.directory = str(directory)
    self._ckptr = ocp.PyTreeCheckpointer()
    try:
      meta = self._ckptr.metadata(self.directory)
    except Exception as e:  # orbax raises several error types
      raise ValueError(f"cannot read the Orbax metadata of {directory!r}: {e}"
                       ) from e
    tree = getattr(meta, "item_metadata", meta)
    tree = getattr(tree, "tree", tree)
    if not isinstance(tree, Mapping):
      raise ValueError(f"{directory!r} is not an Orbax PyTree checkpoint "
                       f"(metadata is {type(tree).__name__})")
    self.tree = tree

  def read(self, keys: tuple[str, ...], dtype=None) -> np.ndarray:
    """Restores the one leaf at ``keys`` as numpy, cast to ``dtype``.

    With a manifest the leaf is restored in its stored dtype, checked, then
    cast.
    """
    check = self.manifest is not None
    item, args = 0, self._ocp.RestoreArgs(restore_type=np.ndarray,
                                          dtype=None if check else dtype)
    for key in reversed(keys):
      item, args = {key: item}, {key: args}
    out = self._ckptr.restore(self.directory, args=self._ocp.args.PyTreeRestore(
        item=item, restore_args=args, partial_restore=True))
    for key in keys:
      out = out[key]
    arr = np.asarray(out)
    if check:
      self.manifest.check("/".join(keys), arr, repr(self.directory))
      if dtype is not None and arr.dtype != dtype:
        arr = arr.astype(dtype)
    return arr

  def leaf(self, path: str, keys: tuple[str, ...]) -> Leaf:
    """A :class:`Leaf` of our ``path`` read unchanged from ``keys``."""
    meta = self.metadata(keys)
    return Leaf(path=path, shape=tuple(meta.shape), dtype=np.dtype(meta.dtype),
                read=lambda dt, index: self.read(keys, dt),
                source=f"Orbax leaf '{'/'.join(keys)}'")

  def metadata(self, keys: tuple[str, ...]):
    node = self.tree
    for key in keys:
      node = node[key]
    return node


def orbax_leaves(tree: Mapping, prefix: tuple[str, ...] = ()):
  """[(keys, metadata)] of every value leaf under ``tree`` (sorted)."""
  out = []
  for key in sorted(tree):
    val = tree[key]
    if isinstance(val, Mapping):
      out += orbax_leaves(val, prefix + (key,))
    elif val is not None:
      out.append((prefix + (key,), val))
  return out


def resolve_model(model):
  """None, a preset name or a model object -> model object or None."""
  classes = families.model_classes()
  if model is None or isinstance(model, classes):
    return model
  if isinstance(model, str):
    return models.get_model(model)
  raise ValueError(f"model must be a preset name (one of "
                   f"{', '.join(sorted(models.PRESETS))}) or a "
                   f"{' / '.join(c.__name__ for c in classes)}, got "
                   f"{type(model).__name__}")


__all__ = ["Index", "Leaf", "MAX_ABS", "check_values", "OrbaxReader", "PROGRESS_BYTES", "ShardingArg",
           "ShardingFn", "leaf_sharding", "orbax_leaves", "read_leaf",
           "resolve_model", "restore", "target_dtype"]
