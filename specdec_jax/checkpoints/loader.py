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
import os

from etils import epath

from specdec_jax import models
from specdec_jax.checkpoints import (checksums, gemma_official, gguf, hf,
                                     native, t5x, t5x_write)
from specdec_jax.checkpoints.leaves import (  # re-exported
    Index, Leaf, OrbaxReader, PROGRESS_BYTES, ShardingArg, ShardingFn,
    leaf_sharding, orbax_leaves, read_leaf, resolve_model, restore,
    target_dtype)
from specdec_jax.models import families

FORMATS = ("native", "hf", "t5x", "t5x_orbax", "gemma")


# ----------------------------------------------------------------------------
# load / save
# ----------------------------------------------------------------------------


def detect_format(path: str) -> str:
  """'native', 'hf', 't5x', 't5x_orbax', 't5x_tf' or 'gemma' for ``path``.

  Raises:
    ValueError for a missing or empty path, a PyTorch .bin checkpoint, or a
    directory that holds no known checkpoint.
  """
  if str(path).endswith(".gguf"):  # GGUF (llama.cpp): checkpoints/gguf.py
    return "gguf"
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
                 verify_checksums: bool = True, check_values: bool = True):
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
                        progress=progress, source=path, check=check_values)


def load(path: str, model=None, *,
         format: str = "auto",  # pylint: disable=redefined-builtin
         dtype="bfloat16", sharding: ShardingArg = None,
         subtree: str = "target", progress: bool | None = None,
         verify_checksums: bool = True, check_values: bool = True):
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
      mismatch raises ``checksums.ChecksumError`` naming the tensor. A
      checkpoint without one (HF, T5X, Gemma from elsewhere) is checked
      against the sidecar of checksums recorded on its first successful load
      (``checksums.sidecar_path``; docs/checkpoints.md).
    check_values: refuse a tensor with NaN/inf or |x| > 1e4, naming it
      (``leaves.check_values``); False loads implausible values anyway.

  Returns:
    (model, params).
  """
  if str(path).endswith(".gguf"):  # GGUF (llama.cpp): gguf.py
    return gguf.load_gguf(path, model, dtype=dtype, sharding=sharding,
                          progress=progress)
  check = dict(verify_checksums=verify_checksums, check_values=check_values)
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
  model = resolve_model(model)
  if model is None:
    raise ValueError("save needs the model (or its preset name)")
  if format == "native":
    native.save(path, model, params, **options)
  elif format == "hf":
    hf.save_hf(path, model, params, **options)
  elif format in ("t5x", "t5x_orbax"):
    if format not in families.of_model(model).converters:
      holders = [f.name.upper() for f in families.FAMILIES
                 if format in f.converters]
      raise ValueError(f"T5X checkpoints hold {' / '.join(holders)} models, "
                       f"got {type(model).__name__}; use format='gemma' or "
                       f"'hf'")
    model.check_params(params)
    t5x_write.save_t5x(path, params, layout="legacy" if format == "t5x" else "orbax",
                 **options)
  elif format == "gemma":
    gemma_official.save_gemma(path, model, params, **options)
  else:
    raise ValueError(f"unknown checkpoint format {format!r}; expected one of "
                     f"{', '.join(FORMATS)}")


__all__ = ["FORMATS", "Leaf", "OrbaxReader", "ShardingArg", "detect_format",
           "leaf_sharding", "load", "orbax_leaves", "read_leaf",
           "resolve_model", "restore", "save", "target_dtype"]
