"""Parameter trees: '/'-joined flat views and shape checks."""

from __future__ import annotations

from typing import Any, Mapping

import jax
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
  for side, other, says, shape_word in ((want, got, "is missing", "expected "),
                                        (got, want, "has", "")):
    odd = [p for p in side if p not in other]
    if odd:
      kind = "" if side is want else "unexpected "
      raise ValueError(
          f"{what} {says} {len(odd)} {kind}leaf/leaves, first: '{odd[0]}' "
          f"({shape_word}shape {tuple(np.shape(side[odd[0]]))}); the "
          f"checkpoint or parameter tree does not match this architecture")
  for path, ref in want.items():
    shape = tuple(np.shape(got[path]))
    if shape != tuple(ref.shape):
      raise ValueError(
          f"{what} leaf '{path}' has shape {shape}, expected "
          f"{tuple(ref.shape)}; the checkpoint or preset does not match")


def shape_signature(params: Any) -> tuple | None:
  """(tree structure, leaf shapes) of a parameter tree: everything
  :func:`check_params` reads, hashable (a checked tree's signature can be
  remembered). None when a leaf has no ``shape`` (such a tree is always
  checked in full)."""
  leaves, treedef = jax.tree.flatten(params)
  shapes = tuple(getattr(x, "shape", None) for x in leaves)
  if any(s is None for s in shapes):
    return None
  return treedef, shapes
