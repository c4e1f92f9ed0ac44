"""Per-row data of a draft structure: the typed ``Batch.structure`` field.

A structure's static SHAPE is part of the program key (a chain's gamma; a
tree's (nodes N, max depth D, max children C) and proposal; a stack's
buffers); its per-row DATA travels in the batch, traced, so every tree of
one shape shares one compiled program:

    chain   Batch.structure = None
    tree    Batch.structure = TreeArrays (parents, depths, ranks, masks)
    stack   Batch.structure = StackKnobs (the lenient levels' knobs)
"""

from __future__ import annotations

import jax
from flax import struct

from specdec_jax.decoding.rules import knobs as knobs_lib
from specdec_jax.decoding.verify import tree as tree_lib
from specdec_jax.decoding.verify.topology import Topology


@struct.dataclass
class TreeArrays:
  """The per-row arrays of a draft tree (``verify.tree.tree_arrays``).

  Attributes:
    parents: [B, N] int32 parent node (-1 = root).
    depth: [B, N + 1] int32 block depths (root 0).
    rank: [B, N] int32 rank among its siblings.
    slot: [B, N] int32 index among the nodes of the same depth.
    children: [B, N + 1, C] int32 child nodes of block position j (-1 pad).
    mask: [B, N + 1, N + 1] bool ancestor-or-self mask.
    first: [B, D + 2] int32 block position of the first token of each
      depth (N + 1 past the last).
  """

  parents: jax.Array
  depth: jax.Array
  rank: jax.Array
  slot: jax.Array
  children: jax.Array
  mask: jax.Array
  first: jax.Array

  @classmethod
  def of(cls, topology: Topology, batch: int) -> "TreeArrays":
    """The arrays of ``topology`` for ``batch`` rows (device arrays)."""
    arrays = tree_lib.tree_arrays(topology, batch)
    return cls(**jax.device_put({k.split(".", 1)[1]: v
                                 for k, v in arrays.items()}))

  def as_dict(self) -> dict[str, jax.Array]:
    """The ``'tree.<name>'`` dict the tree kernels read
    (``verify.tree.verify_tree``, ``loops.tree_drafting.draft_tree``)."""
    return {k: getattr(self, k.split(".", 1)[1]) for k in tree_lib.ARRAYS}


@struct.dataclass
class StackKnobs:
  """The traced knobs of a stack's lenient intermediate levels.

  Attributes:
    lenient: one dict per intermediate level n = 1..K-1, knob name -> [B]
      (empty for an exact level).
  """

  lenient: tuple

  @classmethod
  def of(cls, knobs: tuple, batch: int) -> "StackKnobs":
    """Per-row [B] arrays of each level's knob dict."""
    return cls(lenient=jax.device_put(tuple(
        knobs_lib.per_row(k, batch, f"level {n} method")
        for n, k in enumerate(knobs, 1))))
