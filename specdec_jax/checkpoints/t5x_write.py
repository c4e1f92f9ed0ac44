"""Writing T5X checkpoints: the legacy msgpack + TensorStore layout and Orbax.

The layouts are described in ``t5x.py`` (which reads them); what t5x writes
as ``checkpoint_<step>``, plus ``checksums.json``.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np
import tensorstore as ts
from etils import epath
from flax import serialization

from specdec_jax import models
from specdec_jax.checkpoints import checksums
from specdec_jax.checkpoints import leaves as leaf_lib
from specdec_jax.checkpoints.t5x import (CHUNK_BYTES, DUMMY_BUCKET, TS_CONTEXT,
                                         VERSION, absolute_spec)


def chunk_shape(shape: tuple[int, ...], max_elements: int) -> list[int]:
  """t5x's TensorStore chunk: the largest divisor-shaped block of at most
  ``max_elements`` elements, shrinking the largest dimension first."""
  divisors = [[d for d in range(1, max(n, 1) + 1) if max(n, 1) % d == 0]
              for n in shape]
  while math.prod(d[-1] for d in divisors) > max_elements:
    i = max(range(len(shape)), key=lambda j: divisors[j][-1])
    divisors[i].pop()
  return [d[-1] for d in divisors]


def relative_spec(name: str, arr: np.ndarray, gcs: bool = False) -> dict:
  """The ts.Spec dict t5x stores in the msgpack for array ``name``.

  Args:
    name: '/'-joined path in the state dict, e.g. 'target/encoder/...'.
    arr: the array (its shape and dtype).
    gcs: the checkpoint is written to gs:// (dummy-bucket gcs kvstore).
  """
  dtype = np.dtype(arr.dtype)
  metadata = {"compressor": {"id": "gzip"}, "shape": list(arr.shape),
              "chunks": chunk_shape(arr.shape, CHUNK_BYTES // dtype.itemsize)}
  spec = {"driver": "zarr", "dtype": jnp.dtype(dtype).name,
          "metadata": metadata}
  if gcs:
    spec.update(kvstore={"driver": "gcs", "bucket": DUMMY_BUCKET},
                path=name.replace("/", "."))
  else:
    spec["kvstore"] = {"driver": "file", "path": name.replace("/", ".")}
  return ts.Spec(spec).to_json()


def _host(x, dtype) -> np.ndarray:
  arr = np.asarray(x)
  return arr.astype(dtype) if dtype is not None and arr.dtype != dtype else arr


def save_t5x(path: str, target: Mapping, step: int = 0,
             layout: str = "legacy", dtype=None) -> None:
  """Writes a T5X checkpoint directory (what t5x writes as checkpoint_<step>).

  The checkpoint holds ``target`` and the step but no optimizer state
  (``param_states`` is empty), plus ``checksums.json`` (SHA-256 of every
  stored target array, keyed 'target/...'; t5x ignores the file).

  Args:
    path: the step directory to create, e.g. '/out/checkpoint_1000' (must
      not exist or be empty); gs:// is passed through to TensorStore.
    target: nested dict of arrays: our params, or {'draft': ..., 'target':
      ...} for a merged two-model checkpoint.
    step: training step recorded in the checkpoint.
    layout: 'legacy' (msgpack + one zarr TensorStore per array, written
      leaf by leaf) or 'orbax' (``state/``, PyTreeCheckpointHandler with
      OCDBT, as t5x's OrbaxCheckpointManagerInterface).
    dtype: cast the target arrays to this dtype (None: keep theirs; t5x
      itself saves float32).
  """
  if layout not in ("legacy", "orbax"):
    raise ValueError(f"layout must be 'legacy' or 'orbax', got {layout!r}")
  if not isinstance(target, Mapping) or not target:
    raise ValueError("target must be a non-empty nested dict of arrays")
  dt = leaf_lib.target_dtype(dtype)
  p = epath.Path(path)
  if p.exists():
    if not p.is_dir() or any(True for _ in p.iterdir()):
      raise ValueError(f"{str(path)!r} already exists; T5X checkpoints are "
                       f"written once (remove it or pick another step dir)")
    p.rmdir()
  if layout == "orbax":
    _save_orbax(str(path), target, step, dt)
  else:
    _save_legacy(str(path), target, step, dt)


def _save_legacy(path: str, target: Mapping, step: int, dtype) -> None:
  gcs = path.startswith("gs://")
  final = path.rstrip("/")
  tmp = final if gcs else f"{final}.tmp-{int(time.time())}"
  epath.Path(tmp).mkdir(parents=True, exist_ok=True)
  written, sums = {}, {}
  try:
    for name, leaf in models.flatten_params(target).items():
      arr = _host(leaf, dtype)
      spec = relative_spec(f"target/{name}", arr, gcs)
      store = ts.open(absolute_spec(spec, tmp, read=False), create=True,
                      open=True, context=TS_CONTEXT).result()
      store.write(arr).result()
      written[name] = spec
      sums[f"target/{name}"] = checksums.entry(arr)
    contents = {"version": VERSION, "optimizer": {
        "target": models.unflatten_params(written),
        "state": {"step": np.int32(step), "param_states": {}}}}
    (epath.Path(tmp) / "checkpoint").write_bytes(
        serialization.msgpack_serialize(contents))
    checksums.write(tmp, sums)
  except BaseException:
    if not gcs:
      shutil.rmtree(tmp, ignore_errors=True)
    raise
  if tmp != final:
    os.replace(tmp, final)


def _save_orbax(path: str, target: Mapping, step: int, dtype) -> None:
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  tree = {"target": dict(target),
          "state": {"step": np.int32(step), "param_states": {}}}
  save_args = {"target": jax.tree.map(lambda _: ocp.SaveArgs(dtype=dtype),
                                      tree["target"]),
               "state": {"step": ocp.SaveArgs(), "param_states": {}}}
  handler = ocp.CompositeCheckpointHandler(
      state=ocp.PyTreeCheckpointHandler(use_ocdbt=True))
  with ocp.Checkpointer(handler) as ckptr:
    ckptr.save(path, args=ocp.args.Composite(
        state=ocp.args.PyTreeSave(tree, save_args=save_args)))
  checksums.write_arrays(path, (
      (f"target/{name}", _host(leaf, dtype))
      for name, leaf in models.flatten_params(tree["target"]).items()))


__all__ = ["chunk_shape", "relative_spec", "save_t5x"]
