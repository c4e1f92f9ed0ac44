"""Device mesh and the ONE table of logical-axis rules.

Every parameter and cache axis has a logical name; :data:`LOGICAL_AXIS_RULES`
maps logical names to mesh axes (t5x ``standard_logical_axis_rules`` style).
Nothing else in the code base names mesh axes. Parameters' logical names are
declared by the model layers that create them (``models.layers.
param_with_axes``); :func:`param_logical_axes` reads those declarations.

Logical axes:
    batch, cache_batch      rows of a batch (data parallel)
    length, cache_length    sequence positions
    vocab, embed            vocabulary rows, model width
    heads, kv_heads, head_dim, joined_kv (= heads * head_dim, T5 kernels)
    mlp                     MLP hidden units
    stack                   small stacked axes (K/V pair, gate/up pair)
    relpos_buckets          T5 relative-position buckets
"""

from __future__ import annotations

from typing import Mapping, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from specdec_jax.models import axes as models_axes
from specdec_jax.models.params import flatten_params, unflatten_params

MESH_AXES = ("data", "fsdp", "model")

# logical axis -> mesh axis (None = replicated). The first rule wins.
LOGICAL_AXIS_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ("batch", "data"),
    ("cache_batch", "data"),
    ("vocab", "model"),
    ("heads", "model"),
    ("kv_heads", "model"),
    ("joined_kv", "model"),
    ("mlp", "model"),
    ("embed", "fsdp"),
    ("head_dim", None),
    ("length", None),
    ("cache_length", None),
    ("stack", None),
    ("relpos_buckets", None),
)

def param_logical_axes(params: Mapping) -> dict:
  """Logical axis names of every parameter, as the model layers declare them.

  The names come from the families' declarations (each layer creates its
  parameters with ``models.layers.param_with_axes``), collected by
  ``models.axes``; a leaf is matched by the longest suffix of its path with
  layer indices as wildcards.

  Args:
    params: nested parameter dict (arrays or ShapeDtypeStructs) of a T5Model
      or GemmaModel of any size; also works on merged trees ({'draft': ...,
      'target': ...}) since matching is by path suffix.

  Returns:
    A nested dict of the same structure whose leaves are tuples of logical
    axis names, one per array dimension.

  Raises:
    ValueError if a parameter has no declared axes or a different rank.
  """
  out = {}
  for path, leaf in flatten_params(params).items():
    axes = models_axes.lookup(path)
    if axes is None:
      raise ValueError(
          f"no logical-axis rule for parameter '{path}'; no model family "
          f"declares it: create it with specdec_jax.models.layers."
          f"param_with_axes (giving its logical axis names)")
    if len(axes) != len(np.shape(leaf)):
      raise ValueError(f"logical axes {axes} do not fit parameter '{path}'"
                       f" of shape {np.shape(leaf)}")
    out[path] = axes
  return unflatten_params(out)


def logical_to_spec(axes: Sequence[str | None], rules=LOGICAL_AXIS_RULES,
                    shape: Sequence[int] | None = None,
                    mesh: Mesh | None = None) -> PartitionSpec:
  """Logical axis names -> PartitionSpec through the rules table.

  A mesh axis is used at most once per array (later dimensions that map to
  an already-used mesh axis are replicated instead). With ``shape`` and
  ``mesh``, a dimension the mesh axis does not divide evenly is replicated
  (e.g. 4 heads on an 8-way model axis), so any preset fits any mesh.
  """
  table = {}
  for name, mesh_axis in rules:
    table.setdefault(name, mesh_axis)
  used, spec = set(), []
  for dim, name in enumerate(axes):
    if name is not None and name not in table:
      raise ValueError(f"logical axis {name!r} has no rule in "
                       f"LOGICAL_AXIS_RULES")
    mesh_axis = None if name is None else table[name]
    if mesh_axis is not None and mesh_axis in used:
      mesh_axis = None
    if (mesh_axis is not None and shape is not None and mesh is not None
        and shape[dim] % dict(mesh.shape)[mesh_axis]):
      mesh_axis = None
    if mesh_axis is not None:
      used.add(mesh_axis)
    spec.append(mesh_axis)
  return PartitionSpec(*spec)


def named(mesh: Mesh, axes: Sequence[str | None], shape) -> NamedSharding:
  """NamedSharding of an array of ``shape`` with logical ``axes``."""
  return NamedSharding(mesh, logical_to_spec(axes, shape=shape, mesh=mesh))


def make_mesh(data: int = 1, fsdp: int = 1, model: int = 1,
              devices=None) -> Mesh:
  """A (data, fsdp, model) mesh over ``devices`` (default: all devices).

  Raises:
    ValueError if the axis sizes do not multiply to the device count.
  """
  devices = jax.devices() if devices is None else list(devices)
  sizes = (data, fsdp, model)
  if any(s < 1 for s in sizes):
    raise ValueError(f"mesh axis sizes must be >= 1, got data={data}, "
                     f"fsdp={fsdp}, model={model}")
  if int(np.prod(sizes)) != len(devices):
    raise ValueError(f"mesh data={data} x fsdp={fsdp} x model={model} = "
                     f"{int(np.prod(sizes))} devices, but {len(devices)} are "
                     f"available; choose sizes whose product is "
                     f"{len(devices)}")
  return Mesh(np.asarray(devices).reshape(sizes), MESH_AXES)


def param_shardings(params: Mapping, mesh: Mesh) -> dict:
  """NamedSharding of every parameter on ``mesh`` (same tree structure)."""
  axes = flatten_params(param_logical_axes(params))
  flat = flatten_params(params)
  return unflatten_params({p: named(mesh, axes[p], np.shape(x))
                           for p, x in flat.items()})


def param_sharding_fn(mesh: Mesh, model):
  """(path, shape) -> NamedSharding for ``checkpoints.load(sharding=...)``:
  each leaf is placed on the mesh as it is read."""
  axes = flatten_params(param_logical_axes(model.param_shapes()))
  return lambda path, shape: named(mesh, axes[path], shape)


# Logical axes of KV-cache leaves.
SELF_KV_AXES = ("cache_batch", "cache_length", "kv_heads", "head_dim")
CROSS_KV_AXES = ("cache_batch", "length", "heads", "head_dim")


def cache_shardings(cache, mesh: Mesh):
  """Shardings of a KVCache (or its ShapeDtypeStructs), same structure."""
  from specdec_jax.models.cache import LayerKV  # pylint: disable=g-import-not-at-top
  layer = lambda kv, axes: LayerKV(k=named(mesh, axes, kv.k.shape),
                                   v=named(mesh, axes, kv.v.shape))
  return cache.replace(
      lengths=named(mesh, ("cache_batch",), cache.lengths.shape),
      layers=tuple(layer(kv, SELF_KV_AXES) for kv in cache.layers),
      cross=None if cache.cross is None else tuple(
          layer(kv, CROSS_KV_AXES) for kv in cache.cross),
      cross_mask=None if cache.cross_mask is None else named(
          mesh, ("cache_batch", "length"), cache.cross_mask.shape))


def batch_sharding(x, mesh: Mesh, batch: int) -> NamedSharding:
  """Rows ([batch, ...] leaves) over 'data'; anything else replicated."""
  shape = np.shape(x)
  if shape and shape[0] == batch:
    return named(mesh, ("batch",) + (None,) * (len(shape) - 1), shape)
  return NamedSharding(mesh, PartitionSpec())


def args_shardings(args, mesh: Mesh):
  """Shardings of decode ``args = (params, batch)``: one parameter tree per
  level of the stack (None for a level the method does not run), then the
  batch (rows over 'data')."""
  params, batch = args
  b = batch.prompt.shape[0]
  return (tuple(param_shardings(p, mesh) if p else p for p in params),
          jax.tree.map(lambda x: batch_sharding(x, mesh, b), batch))


def state_shardings(state, mesh: Mesh, batch: int):
  """Shardings of a decode-loop state: KV caches by their logical axes,
  per-row fields ([batch, ...]) over 'data', scalars replicated."""
  from specdec_jax.models.cache import KVCache  # pylint: disable=g-import-not-at-top

  def one(x):
    if isinstance(x, KVCache):
      return cache_shardings(x, mesh)
    return batch_sharding(x, mesh, batch)

  return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, KVCache))
