"""Logical axes declared by the model families, keyed by path pattern.

Each layer declares the logical axis names of the parameters it creates
(:func:`specdec_jax.models.layers.param_with_axes`). This module collects
those declarations per family, from an abstract init of a small model that
has every kind of parameter, into one table of path patterns where layer
indices are wildcards (``decoder/layers_*/mlp/wo/kernel``), so that a params
tree of any size of a family, or a tree nesting one (the t5x
``{'draft': ..., 'target': ...}`` tree), can be labelled by path suffix.
Mapping logical names to mesh axes is ``specdec_jax.sharding``'s job.
"""

from __future__ import annotations

import functools
import re
from typing import Mapping

from specdec_jax.models.params import flatten_params

_LAYER_INDEX = re.compile(r"(^|/)(layers?_)\d+(?=/|$)")


def path_pattern(path: str) -> str:
  """'decoder/layers_11/mlp/wo/kernel' -> 'decoder/layers_*/mlp/wo/kernel'."""
  return _LAYER_INDEX.sub(r"\1\2*", path)


def _families():
  # Imported here: the families import this package's leaf modules.
  from specdec_jax.models import families  # pylint: disable=g-import-not-at-top
  return families.model_classes()


@functools.lru_cache(maxsize=None)
def declared_param_axes() -> Mapping[str, tuple[str, ...]]:
  """{path pattern: logical axes} of every parameter of every family.

  Raises:
    ValueError if two declarations of one pattern disagree.
  """
  table: dict[str, tuple[str, ...]] = {}
  for family in _families():
    for model in family.axes_examples():
      for path, axes in flatten_params(model.param_axes()).items():
        pattern = path_pattern(path)
        if table.setdefault(pattern, axes) != axes:
          raise ValueError(f"parameter pattern '{pattern}' is declared with "
                           f"axes {table[pattern]} and {axes}")
  return table


def lookup(path: str) -> tuple[str, ...] | None:
  """Declared axes of the parameter at ``path`` (longest suffix match).

  Args:
    path: '/'-joined parameter path, possibly nested under other keys.

  Returns:
    The tuple of logical names, or None if no family declares it.
  """
  table = declared_param_axes()
  parts = path_pattern(path).split("/")
  for i in range(len(parts)):
    axes = table.get("/".join(parts[i:]))
    if axes is not None:
      return axes
  return None
