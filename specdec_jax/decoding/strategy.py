"""The decoding strategy: HOW to decode, as one typed, hashable value.

A :class:`Strategy` is a method rule (``make_method('token_v3', alpha=.3)``:
target-only, speculative toward a target T(q, p), a cascade, ...), a draft
STRUCTURE and a sampling transform:

    Chain(gamma)                 a block of ``gamma`` drafted tokens, verified
                                 in one verifier step (``loops/speculative``)
    Tree(topology, proposal)     a token tree per block, verified in ONE
                                 verifier step (``loops/tree``; the class is
                                 ``verify.tree.Tree``)
    Stack(buffers, lenient)      a hierarchy of K drafters and the target
                                 (``hierarchy/loop``)

    s = Strategy(make_method("token_v3", alpha=0.3), Tree(
        Topology.kary(2, 3)), sampling=TopP(0.9))
    s = Strategy.of("spec_decode", Chain(4))
    decoding.decode(s, models, params, prompts, max_new_tokens=32)

Every entry point (``generate``, ``generate_hierarchy``, the t5x Models, the
CLI and gin, the evaluation harness, the planners) builds this value, and
:func:`specdec_jax.decoding.request.decode` runs it. Nothing here traces.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Union

import numpy as np

from specdec_jax.decoding import registry
from specdec_jax.decoding.rules import sampling as sampling_lib
from specdec_jax.decoding.verify.topology import Topology
from specdec_jax.decoding.verify.tree import Tree


@dataclasses.dataclass(frozen=True)
class Chain:
  """A chain of ``gamma`` drafted tokens per block (the classic draft).

  Attributes:
    gamma: draft block size, >= 1.
  """

  gamma: int = 5

  def __post_init__(self):
    if isinstance(self.gamma, bool) or not isinstance(
        self.gamma, (int, np.integer)) or self.gamma < 1:
      raise ValueError(f"gamma must be an integer >= 1, got {self.gamma!r}")
    object.__setattr__(self, "gamma", int(self.gamma))

  @property
  def topology(self) -> Topology:
    """The chain as a one-branch topology."""
    return Topology.chain(self.gamma)


@dataclasses.dataclass(frozen=True)
class Stack:
  """A hierarchy: K drafters below the target (HSD, Globerson et al.).

  The models of the K + 1 levels are passed to ``decode`` (cheapest first,
  the target last); this value holds only how they draft.

  Attributes:
    buffers: (T_0, ..., T_{K-1}): level 0 drafts T_0 tokens per batch;
      level n accumulates verified tokens until it holds >= T_n.
    lenient: for the intermediate levels 1..K-1, a speculative method
      (a cascade target) each verifies with, or None (exact SpecDecode).
      A ``{n: method}`` mapping is accepted and becomes this tuple.
  """

  buffers: tuple[int, ...]
  lenient: tuple[Any, ...] = ()

  def __post_init__(self):
    buffers = self.buffers
    if isinstance(buffers, (int, np.integer, str)):
      raise ValueError(f"Stack.buffers must be a sequence of integers "
                       f"(T_0, ..., T_K-1), got {buffers!r}")
    buffers = tuple(buffers)
    for i, t in enumerate(buffers):
      if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 1:
        raise ValueError(f"buffer T_{i} must be an integer >= 1, got {t!r}")
    object.__setattr__(self, "buffers", tuple(int(t) for t in buffers))
    lenient = self.lenient
    if isinstance(lenient, Mapping) or lenient is None:
      levels = [None] * max(len(buffers) - 1, 0)
      for n, method in dict(lenient or {}).items():
        if not (isinstance(n, (int, np.integer)) and 1 <= n <= len(levels)):
          raise ValueError(f"lenient levels are the intermediate ones, 1.."
                           f"{len(levels)}; got level {n!r}")
        levels[n - 1] = method
      lenient = tuple(levels)
    object.__setattr__(self, "lenient", tuple(lenient))

  @property
  def depth(self) -> int:
    """K: the index of the top level (number of models - 1)."""
    return len(self.buffers)

  def lenient_map(self) -> dict[int, Any]:
    """{n: method} of the lenient intermediate levels."""
    return {n: m for n, m in enumerate(self.lenient, 1) if m is not None}


Structure = Union[Chain, Tree, Stack]


def as_structure(structure=None, *, gamma: int | None = None,
                 tree=None) -> Structure:
  """The structure value of the legacy arguments (``gamma=``, ``tree=``).

  Args:
    structure: a Chain / Tree / Stack (returned as is), a Topology (a tree
      with the default proposal) or None.
    gamma: chain block size when neither ``structure`` nor ``tree`` is set.
    tree: a ``Tree`` or ``Topology`` (``generate(..., tree=)``).

  Raises:
    ValueError for anything else.
  """
  if structure is None and tree is not None:
    structure = tree
  if structure is None:
    return Chain(5 if gamma is None else gamma)
  if isinstance(structure, Topology):
    return Tree(structure)
  if isinstance(structure, (Chain, Tree, Stack)):
    return structure
  raise ValueError(f"a draft structure is decoding.Chain(gamma), "
                   f"decoding.Tree(topology, proposal) or decoding.Stack("
                   f"buffers); got {type(structure).__name__} (a tree "
                   f"must be a decoding.Tree, e.g. decoding.Tree("
                   f"decoding.Topology.kary(2, 3)))")


@dataclasses.dataclass(frozen=True)
class Strategy:
  """How to decode: method rule + draft structure + sampling.

  Attributes:
    method: a method object (``make_method(name, **knobs)``).
    structure: Chain / Tree / Stack (default ``Chain(5)``).
    sampling: a sampling transform (Greedy, Temperature, TopK, TopP).
  """

  method: Any
  structure: Structure = Chain()
  sampling: Any = dataclasses.field(default_factory=sampling_lib.Greedy)

  def __post_init__(self):
    object.__setattr__(self, "structure", as_structure(self.structure))
    if self.sampling is None:
      object.__setattr__(self, "sampling", sampling_lib.Greedy())

  @classmethod
  def of(cls, method: str, structure=None, sampling=None,
         **knobs) -> "Strategy":
    """A strategy from a method NAME and its knobs (``registry.py``)."""
    return cls(registry.make_method(method, **knobs),
               as_structure(structure), sampling)

  @property
  def kind(self) -> str:
    """'chain', 'tree' or 'stack'."""
    return {Chain: "chain", Tree: "tree", Stack: "stack"}[type(
        self.structure)]

  def replace(self, **changes) -> "Strategy":
    return dataclasses.replace(self, **changes)
