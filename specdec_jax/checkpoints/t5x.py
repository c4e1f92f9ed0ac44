"""T5X checkpoints: the legacy msgpack + TensorStore layout and Orbax.

Legacy layout (t5x/checkpoints.py ``Checkpointer``, version 3), one directory
per step::

    checkpoint_<step>/checkpoint   msgpack (flax.serialization) of
        {'version': 3, 'optimizer': {'target': params,
                                     'state': {'step': int32,
                                               'param_states': ...}}}
    checkpoint_<step>/target.encoder.layers_0.attention.query.kernel/
        one zarr TensorStore per partitioned array (.zarray + chunk files
        '0.0', ...; gzip), named by its path with '/' -> '.'. The msgpack
        holds the RELATIVE ts.Spec dict in the array's place:
        {'driver': 'zarr', 'dtype': 'float32',
         'kvstore': {'driver': 'file', 'path': 'target.encoder...kernel/'},
         'metadata': {'chunks': [...], 'compressor': {'id': 'gzip',
                      'level': 1}, 'shape': [...]}}

Unpartitioned leaves (the step, small optimizer states) are inline in the
msgpack. GCS checkpoints name the kvstore {'driver': 'gcs', 'bucket':
't5x-dummy-bucket'}; on reading, the driver, bucket and directory always come
from where the checkpoint is read, so checkpoints can be moved and gs://
paths go straight to TensorStore.

Orbax layout (t5x ``OrbaxCheckpointManagerInterface``): ``checkpoint_<step>/
state/`` is a ``PyTreeCheckpointHandler(use_ocdbt=True)`` item (marked by its
``_METADATA`` file) holding {'target': params, 'state': {'step', ...}}.

TF layout (Mesh TensorFlow: a ``checkpoint`` text file starting with
``model_checkpoint_path``): not read here; convert it with t5x first.

Our T5 parameter names are t5x's, so a ``target`` tree loads as is.
Writing (``save_t5x``) is ``t5x_write.py``.
"""

from __future__ import annotations

import copy
import functools
import os
import posixpath
import re
from typing import Any, Mapping

import jax.numpy as jnp
import numpy as np
import tensorstore as ts
from etils import epath
from flax import serialization

from specdec_jax import models
from specdec_jax.checkpoints import checksums
from specdec_jax.checkpoints import leaves as leaf_lib
from specdec_jax.models import families

VERSION = 3
CHUNK_BYTES = 64 * 1024 * 1024  # t5x's desired TensorStore chunk size
DUMMY_BUCKET = "t5x-dummy-bucket"
_TF_MAGIC = b"model_checkpoint_path"
_SPEC_KEYS = frozenset({"driver", "kvstore", "metadata"})
TS_CONTEXT = ts.Context({"file_io_concurrency": {"limit": 128}})


# ----------------------------------------------------------------------------
# Finding and detecting checkpoints
# ----------------------------------------------------------------------------


def _file_kind(file: epath.Path) -> str:
  with file.open("rb") as f:
    return "t5x_tf" if f.read(len(_TF_MAGIC)) == _TF_MAGIC else "t5x"


def locate_t5x(path: str) -> tuple[str, str]:
  """Finds the checkpoint at ``path`` (as t5x's ``find_checkpoint`` does).

  Args:
    path: a step directory, its ``checkpoint`` file, an Orbax item directory,
      or a model directory (its highest ``checkpoint_<step>`` is used).

  Returns:
    ('t5x' | 't5x_tf', the msgpack / text file) or ('orbax', the directory
    holding ``_METADATA``).
  """
  p = epath.Path(path)
  if not p.exists():
    raise ValueError(f"checkpoint path {str(path)!r} does not exist")
  if not p.is_dir():
    return _file_kind(p), str(p)
  for d in (p, p / "state", p / "default"):
    if (d / "_METADATA").exists():
      return "orbax", str(d)
  for f in (p / "checkpoint", p / "state" / "checkpoint"):
    if f.is_file():
      return _file_kind(f), str(f)
  steps = []
  for child in p.iterdir():
    m = re.fullmatch(r"checkpoint_(\d+)", child.name)
    if m and child.is_dir():
      steps.append((int(m.group(1)), str(child)))
  if steps:
    return locate_t5x(max(steps)[1])
  if not any(True for _ in p.iterdir()):
    raise ValueError(f"checkpoint directory {str(path)!r} is empty")
  raise ValueError(f"no checkpoint in {str(path)!r}: expected a 'checkpoint' "
                   f"msgpack file, an Orbax '_METADATA' (possibly under "
                   f"state/), or checkpoint_<step> subdirectories")


def detect_t5x_format(path: str) -> str:
  """'t5x' (legacy msgpack), 'orbax' or 't5x_tf' (see :func:`locate_t5x`)."""
  return locate_t5x(path)[0]


def _tf_error(path) -> ValueError:
  return ValueError(
      f"{str(path)!r} is a TensorFlow (Mesh TensorFlow) T5 checkpoint, which "
      f"is not supported: convert it to a T5X checkpoint first (t5x "
      f"scripts/convert_tf_checkpoint.py), then load that")


# ----------------------------------------------------------------------------
# Reading
# ----------------------------------------------------------------------------


def _is_spec(x: Any) -> bool:
  return isinstance(x, Mapping) and _SPEC_KEYS <= set(x)


def _read_msgpack(file: str) -> dict:
  """The optimizer state dict of a legacy msgpack file (specs not opened)."""
  raw = epath.Path(file).read_bytes()
  try:
    contents = serialization.msgpack_restore(raw)
  except Exception as e:  # msgpack raises several error types
    raise ValueError(f"{file!r} is not a valid T5X msgpack checkpoint ({e}); "
                     f"the file is truncated or corrupt") from None
  if not isinstance(contents, dict):
    raise ValueError(f"{file!r} is not a T5X msgpack checkpoint (it holds a "
                     f"{type(contents).__name__})")
  version = contents.get("version", 0)
  if version == 0:  # a plain Flax checkpoint: the state dict itself
    return contents
  if version < 2 or "optimizer" not in contents:
    raise ValueError(f"{file!r}: T5X checkpoint version {version} without a "
                     f"readable 'optimizer' is not supported")
  return contents["optimizer"]


def _subtree(tree: Mapping, subtree: str, where: str):
  node, parts = tree, subtree.strip("/").split("/")
  for i, key in enumerate(parts):
    if not isinstance(node, Mapping) or _is_spec(node) or key not in node:
      found = sorted(node) if isinstance(node, Mapping) else []
      raise ValueError(f"checkpoint {where!r} has no subtree {subtree!r}: "
                       f"no '{key}' under '{'/'.join(parts[:i]) or '/'}' "
                       f"(found {found})")
    node = node[key]
  if not isinstance(node, Mapping) or _is_spec(node):
    raise ValueError(f"subtree {subtree!r} of checkpoint {where!r} is one "
                     f"array, not a parameter tree")
  return node


def _walk(tree: Mapping, prefix: str = ""):
  """(path, spec dict or inline value) of every leaf, sorted."""
  for key in sorted(tree):
    val, path = tree[key], f"{prefix}/{key}" if prefix else str(key)
    if isinstance(val, Mapping) and not _is_spec(val):
      yield from _walk(val, path)
    elif val is not None:
      yield path, val


def absolute_spec(spec: Mapping, step_dir: str, read: bool = True) -> dict:
  """The relative ts.Spec dict of the msgpack -> one TensorStore can open.

  The kvstore (file, gfile or gcs; the path in the kvstore or, in old specs,
  at the top level) is rebuilt from ``step_dir``: a local directory or
  ``gs://bucket/dir``. For reading, chunks and compressor are dropped so the
  ``.zarray`` decides (as t5x does) while shape and dtype stay checked.
  """
  spec = copy.deepcopy(dict(spec))
  rel = spec.get("kvstore", {}).get("path", spec.get("path"))
  if rel is None:
    raise ValueError(f"TensorStore spec without a path: {spec}")
  spec.pop("path", None)
  m = re.fullmatch(r"gs://([^/]+)/?(.*)", str(step_dir), re.DOTALL)
  if m:
    spec["kvstore"] = {"driver": "gcs", "bucket": m.group(1),
                       "path": posixpath.join(m.group(2), rel)}
  else:
    spec["kvstore"] = {"driver": "file", "path": os.path.join(step_dir, rel)}
  if read:
    spec["metadata"] = {k: v for k, v in spec.get("metadata", {}).items()
                        if k not in ("chunks", "compressor")}
  return spec


def _open(spec: dict):
  """Opens a zarr array; missing chunk files are errors, not zeros."""
  store = ts.open({**spec, "fill_missing_data_reads": False}, open=True,
                  read=True, context=TS_CONTEXT).result()
  if store.fill_value is not None:  # explicit fill value: chunks may be absent
    store = ts.open(spec, open=True, read=True, context=TS_CONTEXT).result()
  return store


def _zarr_leaf(path: str, spec: Mapping, step_dir: str,
               manifest: checksums.Manifest | None = None,
               name: str = "") -> leaf_lib.Leaf:
  """A leaf stored as one zarr array; with a manifest it is read whole (in
  its stored dtype, checked, then cast) instead of per device slice."""
  abs_spec = absolute_spec(spec, step_dir)
  store = functools.cache(lambda: _open(abs_spec))
  meta = abs_spec.get("metadata", {})
  dtype = abs_spec.get("dtype") or meta.get("dtype")
  dtype = np.dtype(jnp.dtype(dtype)) if dtype else store().dtype.numpy_dtype
  shape = tuple(meta["shape"]) if "shape" in meta else store().shape
  where = repr(abs_spec["kvstore"]["path"])

  def read(dt, index):
    s = store()
    if manifest is not None:
      arr = s.read().result()
      manifest.check(name, arr, where)
      return arr if dt is None or arr.dtype == dt else arr.astype(dt)
    if dt is not None and s.dtype.numpy_dtype != dt:
      s = ts.cast(s, np.dtype(dt).name)
    return (s if index is None else s[index]).read().result()

  return leaf_lib.Leaf(path=path, shape=shape, dtype=dtype, read=read,
                     sliced=manifest is None, source=f"zarr array {where}")


def _inline_leaf(path: str, value, manifest: checksums.Manifest | None = None,
                 name: str = "") -> leaf_lib.Leaf:
  arr = np.asarray(value)

  def read(dt, index):
    del dt, index
    if manifest is not None:
      manifest.check(name, arr, "the msgpack")
    return arr

  return leaf_lib.Leaf(path=path, shape=arr.shape, dtype=arr.dtype, read=read,
                     source="an array inline in the msgpack")


def find_manifest(kind: str, where: str) -> checksums.Manifest | None:
  """The checksum manifest of a located T5X checkpoint (in its step dir)."""
  if kind == "orbax":
    parent = os.path.dirname(where.rstrip("/"))
    extra = (parent,) if os.path.basename(where.rstrip("/")) in (
        "state", "default") else ()
    return checksums.find(where, *extra)
  return checksums.find(os.path.dirname(where))


def t5x_leaves(path: str, subtree: str = "target",
               verify_checksums: bool = True) -> list[leaf_lib.Leaf]:
  """The leaves of ``subtree`` of a T5X checkpoint (legacy or Orbax).

  With ``verify_checksums`` and a ``checksums.json`` in the step directory,
  every leaf is checked when it is read.
  """
  kind, where = locate_t5x(path)
  if kind == "t5x_tf":
    raise _tf_error(path)
  manifest = find_manifest(kind, where) if verify_checksums else None
  full = lambda p: f"{subtree.strip('/')}/{p}"
  if kind == "orbax":
    reader = leaf_lib.OrbaxReader(where, manifest)
    prefix = tuple(subtree.strip("/").split("/"))
    _subtree(reader.tree, subtree, where)
    return [reader.leaf("/".join(keys[len(prefix):]), keys)
            for keys, _ in leaf_lib.orbax_leaves(reader.metadata(prefix),
                                               prefix)]
  step_dir = os.path.dirname(where)
  tree = _subtree(_read_msgpack(where), subtree, where)
  return [_zarr_leaf(p, v, step_dir, manifest, full(p)) if _is_spec(v)
          else _inline_leaf(p, v, manifest, full(p)) for p, v in _walk(tree)]


def load_t5x_tree(path: str, dtype=None, subtree: str = "target",
                  verify_checksums: bool = True) -> dict:
  """The whole tree under ``subtree`` (default 'target') as numpy arrays.

  Args:
    path: checkpoint (see :func:`locate_t5x`), legacy or Orbax.
    dtype: cast floating-point leaves to this dtype (None: as stored).
    subtree: '/'-separated path in the checkpoint's state dict.
    verify_checksums: check leaves against ``checksums.json`` if present.

  Returns:
    Nested dict of np.ndarray (e.g. {'draft': ..., 'target': ...} for a
    merged two-model checkpoint).
  """
  dt = leaf_lib.target_dtype(dtype)
  flat = {}
  for leaf in t5x_leaves(path, subtree, verify_checksums):
    cast = dt if jnp.issubdtype(leaf.dtype, jnp.floating) else None
    flat[leaf.path] = leaf_lib.read_leaf(leaf, cast, f"checkpoint {path!r}")
  return models.unflatten_params(flat)


def load_t5x(path: str, model, dtype="bfloat16",
             sharding: leaf_lib.ShardingArg = None, subtree: str = "target",
             progress: bool | None = None,
             verify_checksums: bool = True, check_values: bool = True) -> dict:
  """Restores the T5 parameters of a T5X checkpoint (legacy or Orbax).

  Args:
    path: checkpoint (see :func:`locate_t5x`); gs:// is passed through.
    model: the T5Model (or its preset name) the checkpoint holds.
    dtype: dtype of the restored leaves; None keeps the stored dtype.
    sharding: None, a Sharding, or fn(path, shape) -> Sharding.
    subtree: the parameters' place in the state dict: 'target', or e.g.
      'target/draft' in a merged two-model checkpoint.
    progress: progress bar (None: automatic above ~200 MB).
    verify_checksums: check every leaf against the step directory's
      ``checksums.json`` when it has one (leaves are then read whole), else
      against the sidecar recorded on its first load.
    check_values: refuse NaN/inf or |x| > 1e4 (``leaves.check_values``).

  Returns:
    Nested parameter dict of jax.Arrays, read leaf by leaf.
  """
  model = leaf_lib.resolve_model(model)
  if "t5x" not in families.of_model(model).converters:
    holders = [f.name.upper() for f in families.FAMILIES
               if "t5x" in f.converters]
    raise ValueError(f"T5X checkpoints hold {' / '.join(holders)} models, "
                     f"got {type(model).__name__}")
  source = str(path) if subtree == "target" else f"{path}:{subtree}"
  kind, where = locate_t5x(path)
  foreign = verify_checksums and kind != "t5x_tf" and (
      find_manifest(kind, where) is None)
  return leaf_lib.restore(t5x_leaves(path, subtree, verify_checksums), model,
                          dtype=dtype, sharding=sharding, progress=progress,
                          source=source, check=check_values,
                          sidecar=checksums.sidecar_path(source) if foreign
                          else None)


__all__ = ["absolute_spec", "detect_t5x_format", "find_manifest", "load_t5x",
           "load_t5x_tree", "locate_t5x", "t5x_leaves"]
