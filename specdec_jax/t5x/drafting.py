"""How the t5x Models draft: a chain, a token tree, or a hierarchy.

The speculative Models (``models.py``) hold ONE parameter tree
``{'draft': ..., 'target': ...}``, restored by t5x from one (merged)
checkpoint. Within that contract a Model drafts in one of three ways:

* a chain of ``gamma`` tokens per block (the default; ``decoding.generate``
  with ``gamma``);
* a token tree per block, verified in ONE verifier step by exact recursive
  rejection sampling (``tree=decoding.Tree(...)``, as
  ``decoding.generate(..., tree=...)``; docs/trees.md);
* a hierarchy: the drafter, then early exits of the verifier, then the
  verifier (``hierarchy=Hierarchy(exits=(k, ...), buffers=(T_0, ...))``, as
  ``decoding.hierarchy.api.generate_hierarchy``). An early exit runs the
  verifier's first k decoder layers with the verifier's own parameters
  (``models.early_exit``), so the intermediate levels need no parameters of
  their own and the t5x parameter tree stays ``{'draft', 'target'}``::

      level 0   drafter                       params['draft']
      level 1   early_exit(verifier, exits[0])  params['target']
      ...
      level K   verifier                      params['target']

Everything here is host-side and static (it runs when the Model is built or
traced). The resolved choice is a ``decoding.drafting.Drafting`` (shared
with every adapter that traces the loop itself); :meth:`Drafting.run` runs
the loop inside t5x's trace. Only :class:`Hierarchy` (early exits of the
verifier, the t5x parameter contract) is t5x's own.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from specdec_jax import models as models_lib
from specdec_jax.decoding import drafting as drafting_lib
from specdec_jax.decoding import methods as methods_lib
from specdec_jax.decoding.drafting import Drafting, as_tree
from specdec_jax.decoding.hierarchy.stack import check_levels
from specdec_jax.decoding.strategy import Chain, Stack


@dataclasses.dataclass(frozen=True)
class Hierarchy:
  """Extra draft levels of a t5x Model: early exits of its verifier.

  In gin::

      specdec_jax.t5x.models.SpeculativeEncoderDecoderModel.hierarchy = \\
          @specdec_jax.t5x.models.Hierarchy()
      specdec_jax.t5x.models.Hierarchy.exits = (2,)
      specdec_jax.t5x.models.Hierarchy.buffers = (3, 6)

  Attributes:
    exits: decoder layers run by each intermediate level, cheapest first:
      strictly increasing, each in [1, verifier layers - 1]. Level n (n =
      1..K-1) is ``models.early_exit(verifier, exits[n - 1])`` and reads
      params['target'].
    buffers: (T_0, ..., T_{K-1}), one per level below the verifier
      (``len(exits) + 1`` values >= 1): the drafter drafts T_0 tokens per
      batch; level n accumulates verified tokens until it holds >= T_n.
  """

  exits: Sequence[int]
  buffers: Sequence[int]

  def __post_init__(self):
    for name in ("exits", "buffers"):
      value = getattr(self, name)
      if isinstance(value, (int, np.integer, str)) or not all(
          isinstance(x, (int, np.integer)) and not isinstance(x, bool)
          for x in value):
        raise ValueError(f"Hierarchy.{name} must be a sequence of integers, "
                         f"got {value!r}")
      object.__setattr__(self, name, tuple(int(x) for x in value))
    if not self.exits:
      raise ValueError("Hierarchy.exits is empty: a hierarchy adds at least "
                       "one early exit of the verifier between the drafter "
                       "and the verifier (without one, set gamma instead)")
    if any(b <= a for a, b in zip(self.exits, self.exits[1:])):
      raise ValueError(f"Hierarchy.exits must be strictly increasing "
                       f"(cheapest level first), got {list(self.exits)}")
    if len(self.buffers) != len(self.exits) + 1:
      raise ValueError(
          f"Hierarchy with {len(self.exits)} exit(s) has "
          f"{len(self.exits) + 2} levels and needs {len(self.exits) + 1} "
          f"buffers (T_0 for the drafter, one per exit), got "
          f"{list(self.buffers)}")
    if min(self.buffers) < 1:
      raise ValueError(f"Hierarchy.buffers must all be >= 1, got "
                       f"{list(self.buffers)}")

  def models(self, drafter, verifier) -> tuple:
    """(drafter, early exits..., verifier): the levels, cheapest first."""
    if not isinstance(verifier, models_lib.FlaxDecodeModel):
      raise ValueError(f"a Hierarchy's exits are early exits of the "
                       f"verifier, which must be a {_model_names()}, got "
                       f"{type(verifier).__name__}")
    layers = verifier.depth
    bad = [k for k in self.exits if not 1 <= k < layers]
    if bad:
      raise ValueError(
          f"Hierarchy exit {bad[0]} is outside [1, {layers - 1}]: the "
          f"verifier has {layers} decoder layers and an exit runs fewer "
          f"(an exit at {layers} would be the verifier itself)")
    exits = tuple(models_lib.early_exit(verifier, k) for k in self.exits)
    return (drafter,) + exits + (verifier,)


def resolve(method, drafter, verifier, gamma: int, tree=None,
            hierarchy: Hierarchy | None = None) -> Drafting:
  """Checks a Model's drafting options and resolves them (host side).

  Every bad combination is a ValueError here, when the Model is built,
  before anything is traced or compiled. The result is a
  ``decoding.drafting.Drafting`` (the seam every adapter shares).

  Args:
    method: the Model's method object.
    drafter, verifier: its models.
    gamma: the chain's draft block size (ignored by trees/hierarchies).
    tree: optional Tree / Topology / parent list.
    hierarchy: optional :class:`Hierarchy`.

  Returns:
    Drafting.
  """
  pair = dict(models=(drafter, verifier), param_keys=("draft", "target"))
  if tree is not None and hierarchy is not None:
    raise ValueError("set at most one of tree and hierarchy: a hierarchy's "
                     "levels draft chains, a tree is verified by one model")
  if tree is not None:
    return drafting_lib.resolve(method, structure=as_tree(tree), **pair)
  if hierarchy is None:
    return drafting_lib.resolve(method, structure=Chain(gamma), **pair)
  if not isinstance(hierarchy, Hierarchy):
    raise ValueError(f"hierarchy must be a specdec_jax.t5x.models.Hierarchy"
                     f"(exits=..., buffers=...), got "
                     f"{type(hierarchy).__name__}")
  if not isinstance(method, methods_lib.Speculative):
    raise ValueError(f"a hierarchy's top level verifies with a speculative "
                     f"method (spec_decode, lossy, a cascade rule), got "
                     f"{type(method).__name__}")
  levels = hierarchy.models(drafter, verifier)
  _, _, buffers = check_levels([(m, None) for m in levels],
                               hierarchy.buffers)
  keys = ("draft",) + ("target",) * (len(levels) - 1)
  return drafting_lib.resolve(method, levels, keys, Stack(buffers))


def _model_names() -> str:
  """'T5Model or GemmaModel': the families table's model classes."""
  return " or ".join(c.__name__
                     for c in models_lib.families.model_classes())


__all__ = ["Drafting", "Hierarchy", "as_tree", "resolve"]
