"""Parameter trees: '/'-joined flat views and shape checks."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

Params = Mapping[str, Any]  # nested dict of arrays, Flax 'params' collection


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
  out = {}
  for key in sorted(tree):
    val = tree[key]
    path = f"{prefix}/{key}" if prefix else str(key)
    if isinstance(val, Mapping):
      out.update(_flatten(val, path))
    else:
      out[path] = val
  return out


def flatten_params(tree: Mapping[str, Any]) -> dict[str, Any]:
  """Nested dict -> {'a/b/c': leaf} with '/'-joined paths, sorted."""
  return _flatten(tree)


def unflatten_params(flat: Mapping[str, Any]) -> dict[str, Any]:
  """{'a/b/c': leaf} -> nested dict."""
  out: dict[str, Any] = {}
  for path, val in flat.items():
    node = out
    parts = path.split("/")
    for p in parts[:-1]:
      node = node.setdefault(p, {})
    node[parts[-1]] = val
  return out


def check_params(params: Mapping[str, Any], expected: Mapping[str, Any],
                 what: str = "params") -> None:
  """Compares a parameter tree against the expected shapes.

  Args:
    params: nested dict of arrays (or ShapeDtypeStructs).
    expected: nested dict of arrays/ShapeDtypeStructs with the right shapes.
    what: name used in error messages.

  Raises:
    ValueError naming the first missing, unexpected or wrong-shape leaf.
  """
  if not isinstance(params, Mapping):
    raise ValueError(f"{what} must be a nested dict of arrays, got "
                     f"{type(params).__name__}")
  got, want = flatten_params(params), flatten_params(expected)
  missing = [p for p in want if p not in got]
  if missing:
    raise ValueError(
        f"{what} is missing {len(missing)} leaf/leaves, first: '{missing[0]}' "
        f"(expected shape {tuple(want[missing[0]].shape)}); the checkpoint "
        f"or parameter tree does not match this architecture")
  extra = [p for p in got if p not in want]
  if extra:
    raise ValueError(
        f"{what} has {len(extra)} unexpected leaf/leaves, first: '{extra[0]}' "
        f"(shape {tuple(np.shape(got[extra[0]]))}); the checkpoint or "
        f"parameter tree does not match this architecture")
  for path, ref in want.items():
    shape = tuple(np.shape(got[path]))
    if shape != tuple(ref.shape):
      raise ValueError(
          f"{what} leaf '{path}' has shape {shape}, expected "
          f"{tuple(ref.shape)}; the checkpoint or preset does not match")
