"""Rules split into a static half (compile key) and traced knobs.

Every rule object of the engine (a sampling transform, a target T(q, p), a
draft-stop policy) is a small frozen ``flax.struct`` dataclass: its
``pytree_node=False`` fields (a loss type, whether beta is tuned) choose the
program, its other fields (alpha, beta, temperature, top-p) are numbers that
change from call to call. :func:`split` separates the two:

    static, knobs = split(Chow(alpha=0.3, loss="log"))
    static   # Static(Chow, (('loss', 'log'), ...)): hashable, in the jit key
    knobs    # {'alpha': 0.3}: becomes a [batch] float32 array, traced
    static.bind({'alpha': alpha_b})  # Chow(alpha=alpha_b, loss='log'), in jit

Only plain dicts of arrays cross the ``jit`` boundary, so the compiled
program is chosen by the (hashable) static halves alone: two rule classes
with the same fields can never share a compiled executable.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Hashable, Mapping

import numpy as np

# Knobs that are integers; every other knob is float32.
INT_KNOBS = ("k",)


@dataclasses.dataclass(frozen=True)
class Static:
  """The static half of a rule: its class and its non-traced fields.

  Attributes:
    cls: the rule class.
    fields: sorted ``(name, value)`` pairs of the static fields.
  """

  cls: type
  fields: tuple[tuple[str, Hashable], ...] = ()

  def bind(self, knobs: Mapping[str, Any]):
    """The rule object with ``knobs`` (traced arrays inside a program)."""
    return self.cls(**dict(self.fields), **dict(knobs))

  @property
  def name(self) -> str:
    return self.cls.__name__


def _is_traced(field: dataclasses.Field) -> bool:
  return field.metadata.get("pytree_node", True)


def split(rule) -> tuple[Static, dict[str, Any]]:
  """(static half, knobs dict) of a rule dataclass."""
  fields = dataclasses.fields(rule)
  static = tuple(sorted((f.name, getattr(rule, f.name)) for f in fields
                        if not _is_traced(f)))
  knobs = {f.name: getattr(rule, f.name) for f in fields if _is_traced(f)}
  return Static(type(rule), static), knobs


def per_row(knobs: Mapping[str, Any], batch: int,
            what: str) -> dict[str, Any]:
  """Broadcasts every knob to a canonical ``[batch]`` host array.

  The caller moves them to the device with the rest of its batch (one
  ``jax.device_put`` of all the host arrays: each separate put costs a
  dispatch, ~60 us on CPU). Canonical dtypes (float32; int32 for integer knobs such as top-k; never
  weakly typed) make knob values of any Python or numpy type hit the same
  compiled program.

  Args:
    knobs: name -> scalar, list/tuple of per-row values, or array.
    batch: number of rows.
    what: name used in error messages ('sampling', 'method').

  Returns:
    name -> [batch] numpy array.

  Raises:
    ValueError for a knob with the wrong number of values.
  """
  out = {}
  for name, x in knobs.items():
    dtype = np.int32 if name in INT_KNOBS else np.float32
    arr = np.asarray(x)
    if arr.ndim == 0:  # host arrays: no program compiled per shape
      out[name] = np.full((batch,), arr, dtype)
    elif arr.shape == (batch,):
      out[name] = arr.astype(dtype)
    else:
      raise ValueError(f"{what} knob '{name}' has shape {arr.shape}; use a "
                       f"scalar or one value per row, shape ({batch},)")
  return out
