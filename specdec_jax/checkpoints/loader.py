"""One ``load`` / ``save`` for every checkpoint format, and their restore.

    model, params = load("/ckpt/gemma2-2b-hf")              # HF: config inside
    model, params = load("/ckpt/t5_xl/checkpoint_1000000", "t5_1_1_xl")
    model, params = load("/ckpt/gemma2-9b", "gemma2_9b", sharding=s)
    save("/out/hf", model, params, format="hf")

Formats (:func:`detect_format`):

    native     config.json + params.safetensors (``native.py``)
    hf         config.json + *.safetensors (+ model.safetensors.index.json)
    t5x        legacy T5X: msgpack ``checkpoint`` + one zarr dir per array
    t5x_orbax  T5X with Orbax: ``checkpoint_<step>/state/_METADATA``
    gemma      official Gemma Flax checkpoint (Orbax PyTree, FLAT or NESTED)

T5X and Gemma checkpoints hold no config: pass ``model`` (a model or a preset
name such as ``'t5_1_1_xl'``).

Restoring. A reader describes the checkpoint as a list of :class:`Leaf` (path
in OUR tree, shape, stored dtype, a reader) without reading any data.
:func:`restore` first checks names, shapes and dtypes against the model (so a
wrong preset fails before gigabytes are read), then reads, casts and places
the leaves ONE AT A TIME: beyond what is already on the devices, the host
holds one leaf (and its converted copy), so a 27B checkpoint never needs two
host copies. ``sharding`` is None (default device), one
``jax.sharding.Sharding`` for every leaf, or ``fn(path, shape) -> Sharding``
(our paths and shapes); leaves stored in TensorStore (T5X) are read per
device slice, and replicated slices once.

Checksums. Every :func:`save` writes ``checksums.json`` (SHA-256 of every
stored tensor, ``checksums.py``); :func:`load` checks each tensor as it is
read and raises ``checksums.ChecksumError`` naming it on a mismatch. A
checked T5X leaf is read whole once (the checksum covers the whole tensor)
and sliced on the host; ``verify_checksums=False`` skips the check and reads
per device slice again. Checkpoints without a manifest load unchecked; see
``verify.py`` for a finiteness / statistics check of those.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import tqdm
from etils import epath

from specdec_jax import models
from specdec_jax.checkpoints import checksums, native
from specdec_jax.models import GemmaModel, T5Model

ShardingFn = Callable[[str, tuple[int, ...]], jax.sharding.Sharding]
# None (default device), one Sharding for every leaf, or fn(path, shape).
ShardingArg = jax.sharding.Sharding | ShardingFn | None
Index = tuple[slice, ...]

FORMATS = ("native", "hf", "t5x", "t5x_orbax", "gemma")
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


def _place(leaf: Leaf, dtype, sharding: ShardingArg, what: str) -> jax.Array:
  """Reads one leaf and puts it on device(s)."""
  s = leaf_sharding(sharding, leaf.path, leaf.shape)
  if s is None:
    return jax.device_put(read_leaf(leaf, dtype, what))
  if leaf.sliced:
    shards = {}  # replicated shards are read once

    def callback(index):
      key = tuple((sl.start, sl.stop, sl.step) for sl in index)
      if key not in shards:
        shards[key] = read_leaf(leaf, dtype, what, tuple(index))
      return shards[key]
  else:
    host = read_leaf(leaf, dtype, what)

    def callback(index):
      return host[index]
  try:
    return jax.make_array_from_callback(tuple(leaf.shape), s, callback)
  except (_ReadError, checksums.ChecksumError):
    raise
  except ValueError as e:
    raise ValueError(f"{what}: cannot place '{leaf.path}' {tuple(leaf.shape)} "
                     f"with sharding {s}: {e}") from e


def _progress_bar(progress: bool | None, total: int, desc: str):
  show = total > PROGRESS_BYTES if progress is None else bool(progress)
  return tqdm.tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024,
                   desc=desc, disable=not show, leave=False)


def restore(leaves: Sequence[Leaf], model, *, dtype="bfloat16",
            sharding: ShardingArg = None, progress: bool | None = None,
            source: str = "checkpoint") -> dict:
  """Checks ``leaves`` against ``model``, then reads and places them one by one.

  Args:
    leaves: every leaf of the checkpoint, in our layout.
    model: the T5Model / GemmaModel the parameters are for.
    dtype: dtype of the restored leaves ('bfloat16', 'float32'; None keeps
      the stored dtype).
    sharding: see the module docstring.
    progress: show a progress bar (None: only above ~200 MB).
    source: the checkpoint path, for messages.

  Returns:
    Nested parameter dict of jax.Arrays.

  Raises:
    ValueError naming the first missing, unexpected, wrong-shape, non-float
    or unreadable leaf.
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
  flat = {}
  desc = f"loading {os.path.basename(str(source).rstrip('/'))}"
  with _progress_bar(progress, sum(sizes), desc) as bar:
    for leaf, size in zip(leaves, sizes):
      flat[leaf.path] = _place(leaf, dt, sharding, what)
      bar.update(size)
  params = models.unflatten_params(flat)
  model.check_params(params)
  return params


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


# ----------------------------------------------------------------------------
# load / save
# ----------------------------------------------------------------------------


def resolve_model(model):
  """None, a preset name or a model object -> model object or None."""
  if model is None or isinstance(model, (T5Model, GemmaModel)):
    return model
  if isinstance(model, str):
    return models.get_model(model)
  raise ValueError(f"model must be a preset name (one of "
                   f"{', '.join(sorted(models.PRESETS))}) or a T5Model / "
                   f"GemmaModel, got {type(model).__name__}")


def detect_format(path: str) -> str:
  """'native', 'hf', 't5x', 't5x_orbax', 't5x_tf' or 'gemma' for ``path``.

  Raises:
    ValueError for a missing or empty path, a PyTorch .bin checkpoint, or a
    directory that holds no known checkpoint.
  """
  # pylint: disable=g-import-not-at-top  (the format modules import this one)
  from specdec_jax.checkpoints import t5x
  p = epath.Path(path)
  if not p.exists():
    raise ValueError(f"checkpoint path {str(path)!r} does not exist")
  if native.is_native(str(path)):
    return "native"
  if p.is_dir() and (p / native.CONFIG).exists():
    names = [c.name for c in p.iterdir()]
    if any(n.endswith(".safetensors") for n in names):
      return "hf"
    if any(n.endswith(".bin") for n in names):
      raise ValueError(f"{str(path)!r} holds PyTorch .bin weights, which are "
                       f"not supported: re-save the model with transformers "
                       f"save_pretrained(..., safe_serialization=True)")
    raise ValueError(f"{str(path)!r} has a config.json but no "
                     f"*.safetensors weights")
  kind, directory = t5x.locate_t5x(path)
  if kind != "orbax":
    return kind
  top = set(OrbaxReader(directory).tree)
  return "t5x_orbax" if "target" in top else "gemma"


def _same_config(model, ckpt_model, path: str) -> None:
  """Raises unless ``model`` has the checkpoint's architecture."""
  if type(model.config) is not type(ckpt_model.config):
    raise ValueError(f"checkpoint {path!r} holds a "
                     f"{type(ckpt_model).__name__}, model is a "
                     f"{type(model).__name__}")
  a = dataclasses.asdict(model.config)
  b = dataclasses.asdict(ckpt_model.config)
  for key in a:
    if key not in ("dtype", "param_dtype") and a[key] != b[key]:
      raise ValueError(f"model config does not match checkpoint {path!r}: "
                       f"{key}={a[key]!r} in the model, {b[key]!r} in the "
                       f"checkpoint; pass model=None to use the checkpoint's "
                       f"config")


def _load_native(path: str, dtype, sharding, progress,
                 verify_checksums: bool = True):
  from specdec_jax.checkpoints import hf  # pylint: disable=g-import-not-at-top
  with open(os.path.join(path, native.CONFIG)) as f:
    try:
      meta = json.load(f)
    except json.JSONDecodeError as e:
      raise ValueError(f"{os.path.join(path, native.CONFIG)} is not valid "
                       f"JSON: {e}") from None
  model = models.model_from_config(native.config_from_dict(meta))
  manifest = checksums.find(path) if verify_checksums else None
  files = hf.SafetensorsFiles([os.path.join(path, native.PARAMS)], manifest)
  leaves = [files.leaf(name, name) for name in files.names()]
  return model, restore(leaves, model, dtype=dtype, sharding=sharding,
                        progress=progress, source=path)


def load(path: str, model=None, *,
         format: str = "auto",  # pylint: disable=redefined-builtin
         dtype="bfloat16", sharding: ShardingArg = None,
         subtree: str = "target", progress: bool | None = None,
         verify_checksums: bool = True):
  """Loads any supported checkpoint (see the module docstring).

  Args:
    path: checkpoint directory (T5X: the step directory, its ``checkpoint``
      file, or the model directory for the latest step; gs:// paths are passed
      through to TensorStore / Orbax).
    model: a model or preset name; required for T5X and Gemma (no config in
      the checkpoint). With native / HF it must match the stored config
      (apart from dtype settings) and is returned as is.
    format: 'auto' or one of :data:`FORMATS`.
    dtype: dtype of the restored leaves; None keeps the stored dtype.
    sharding: None, a Sharding, or fn(path, shape) -> Sharding.
    subtree: T5X only: the tree to read, e.g. 'target/draft' in a merged
      two-model checkpoint.
    progress: progress bar (None: automatic above ~200 MB).
    verify_checksums: check every tensor against the checkpoint's
      ``checksums.json`` (written by :func:`save`) when it has one; a
      mismatch raises ``checksums.ChecksumError`` naming the tensor.

  Returns:
    (model, params).
  """
  # pylint: disable=g-import-not-at-top  (the format modules import this one)
  from specdec_jax.checkpoints import gemma_official, hf, t5x
  check = dict(verify_checksums=verify_checksums)
  fmt = detect_format(path) if format == "auto" else format
  if fmt not in FORMATS + ("t5x_tf",):
    raise ValueError(f"unknown checkpoint format {format!r}; expected 'auto' "
                     f"or one of {', '.join(FORMATS)}")
  model = resolve_model(model)
  if subtree != "target" and not fmt.startswith("t5x"):
    raise ValueError(f"subtree= applies to T5X checkpoints only, this one is "
                     f"{fmt!r}")
  if fmt in ("native", "hf"):
    if fmt == "native":
      ckpt_model, params = _load_native(path, dtype, sharding, progress,
                                        **check)
    else:
      ckpt_model, params = hf.load_hf(path, dtype=dtype, sharding=sharding,
                                      progress=progress, **check)
    if model is None:
      return ckpt_model, params
    _same_config(model, ckpt_model, path)
    return model, params
  if model is None:
    raise ValueError(f"{fmt!r} checkpoints hold no model config: pass model= "
                     f"(a preset name such as 't5_1_1_base' or 'gemma2_2b', "
                     f"or a model object)")
  if fmt == "gemma":
    return model, gemma_official.load_gemma(
        path, model, dtype=dtype, sharding=sharding, progress=progress,
        **check)
  return model, t5x.load_t5x(path, model, dtype=dtype, sharding=sharding,
                             subtree=subtree, progress=progress, **check)


def save(path: str, model, params,
         format: str = "native",  # pylint: disable=redefined-builtin
         **options) -> None:
  """Writes ``params`` of ``model`` in ``format``.

  Args:
    path: output directory (T5X: the step directory ``.../checkpoint_<step>``).
    model: model or preset name.
    params: nested parameter dict.
    format: 'native', 'hf', 't5x' (legacy), 't5x_orbax' or 'gemma'.
    **options: passed to the writer (native: dtype; hf: max_shard_bytes;
      t5x: step, dtype; gemma: layout).

  Every format gets a ``checksums.json`` (SHA-256 of every stored tensor),
  which :func:`load` checks.
  """
  # pylint: disable=g-import-not-at-top  (the format modules import this one)
  from specdec_jax.checkpoints import gemma_official, hf, t5x
  model = resolve_model(model)
  if model is None:
    raise ValueError("save needs the model (or its preset name)")
  if format == "native":
    native.save(path, model, params, **options)
  elif format == "hf":
    hf.save_hf(path, model, params, **options)
  elif format in ("t5x", "t5x_orbax"):
    if not isinstance(model, T5Model):
      raise ValueError(f"T5X checkpoints hold T5 models, got "
                       f"{type(model).__name__}; use format='gemma' or 'hf'")
    model.check_params(params)
    t5x.save_t5x(path, params, layout="legacy" if format == "t5x" else "orbax",
                 **options)
  elif format == "gemma":
    gemma_official.save_gemma(path, model, params, **options)
  else:
    raise ValueError(f"unknown checkpoint format {format!r}; expected one of "
                     f"{', '.join(FORMATS)}")


__all__ = ["FORMATS", "Leaf", "OrbaxReader", "ShardingArg", "detect_format",
           "leaf_sharding", "load", "orbax_leaves", "read_leaf",
           "resolve_model", "restore", "save", "target_dtype"]
