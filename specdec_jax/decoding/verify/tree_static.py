"""Static widths of a tree's drafter calls: exact per tree, or bounds over
every tree of one (nodes N, max depth D, max children C) shape.

The tree loop compiles each drafter call at the width these give
(``loops/tree_drafting.py``); the planners price the same widths
(``planners.tree_shape.block_seconds``). Re-exported by ``verify.tree``.
"""

from __future__ import annotations

import numpy as np

from specdec_jax.decoding.verify.topology import Topology


def level_sizes(topology: Topology) -> tuple[int, ...]:
  """Block positions of depth exactly k, k = 0..D (the root: 1)."""
  return tuple(int(x) for x in np.bincount(topology.block_depths()))


def call_widths(n: int, d: int, c: int,
                levels: tuple[int, ...] | None = None) -> tuple[int, ...]:
  """Nodes of depth <= k, for k = 0..D: exact from a tree's
  ``level_sizes``, else the upper bound over (N, D, C) trees.

  Breadth-first numbering puts those nodes first, so drafter call k feeds
  the block prefix [root, nodes 0 .. W_k - 1] only.
  """
  if levels is not None:
    return tuple(int(w) for w in np.cumsum((0,) + tuple(levels[1:])))
  out, level = [0], 1
  for k in range(1, d + 1):
    level *= c
    out.append(min(n - (d - k), out[-1] + level))
  return tuple(out)


def level_bounds(n: int, d: int, c: int,
                 levels: tuple[int, ...] | None = None) -> tuple[int, ...]:
  """Block positions of depth exactly k, k = 0..D: ``levels`` (a tree's
  ``level_sizes``) when given, else the upper bound over (N, D, C) trees
  (a level of an irregular tree can be far smaller: (16, 6, 2) bounds
  its levels by (1, 2, 4, 8, 11, 11, 11))."""
  if levels is not None:
    return tuple(int(x) for x in levels)
  widths = call_widths(n, d, c)
  return (1,) + tuple(max(1, min(c**k, n - d + 1, widths[k] - k + 1))
                      for k in range(1, d + 1))


def feed_widths(n: int, d: int, c: int, level_fed: bool,
                levels: tuple[int, ...] | None = None) -> tuple[int, ...]:
  """Tokens fed by tree-drafting call k = 0..D (compiled widths; exact
  with a tree's ``levels``, as the tree loop compiles them).

  A level-fed drafter (``masks_cached_slots``) gets the root, then one
  level per call (``level_bounds``); any other drafter gets the block
  prefix of depth <= k (``call_widths`` + the root).
  """
  if level_fed:
    return level_bounds(n, d, c, levels)
  return tuple(w + 1 for w in call_widths(n, d, c, levels))


def tree_feed_widths(topology: Topology, level_fed: bool
                     ) -> tuple[int, ...]:
  """:func:`feed_widths` of one tree, as the tree loop compiles it."""
  t = topology
  return feed_widths(t.num_nodes, t.max_depth, t.max_children, level_fed,
                     level_sizes(t))
