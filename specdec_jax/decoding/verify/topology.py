"""Draft topologies: the unit the drafter fills and the verifier scores.

A topology is a static token tree hanging below the ROOT, the last emitted
token of a row (``pending``, not yet in any cache). Its N nodes are drafted
tokens numbered 0..N-1 in breadth-first order; ``parents[i]`` is the node
that node i continues (-1: the root). The verifier scores the block
``[root, node_0, ..., node_{N-1}]`` in ONE step, node i at position
``prefix + depth(i)`` attending to its ancestors only.

    chain(3)          parents (-1, 0, 1)      root - 0 - 1 - 2
    kary(2, 2)        parents (-1, -1, 0, 0, 1, 1)
                             root
                            /    \\
                           0      1
                          / \\    / \\
                         2   3  4   5

A chain of gamma nodes is today's speculative block; every topology is
hashable and frozen (part of the compile key), and all trees with the same
(N, max depth, max children) share one compiled program when passed as data
(``Tree`` in the tree loop).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import numpy as np

MAX_NODES = 4096
"""The largest draft tree (nodes). The verifier scores all N nodes in one
step with an [N + 1, N + 1] ancestor mask per row, and the tree loop keeps
N + 1 cache slots of slack. The dense host mask stays: at this limit it is
16.8 MB (bool) and builds in 0.08-0.37 s (measured on the loaded 2-core
machine: a chain and a star of 4,096 nodes), far more drafted tokens than
any plan uses (the planners stop at 1,024). Without the limit, kary(64, 3)
asked numpy for a 66 GiB mask."""


def _is_int(x) -> bool:
  return not isinstance(x, (bool, np.bool_)) and isinstance(
      x, (int, np.integer))


def _check_count(n: int, what: str) -> None:
  """Refuses a tree of ``n`` nodes before it is built."""
  if n > MAX_NODES:
    raise ValueError(f"{what} has {n:,} nodes, more than the limit of "
                     f"{MAX_NODES:,} (topology.MAX_NODES): its ancestor mask "
                     f"and cache slack grow with the node count; use a "
                     f"smaller tree (fewer children or less depth)")


@dataclasses.dataclass(frozen=True)
class Topology:
  """A static draft tree.

  Attributes:
    parents: ``parents[i]`` in [-1, i): the parent of node i (-1 = root).
      Children of one parent are ranked by node index (rank 0 first).
  """

  parents: tuple[int, ...]

  def __post_init__(self):
    if isinstance(self.parents, (str, bytes)) or not hasattr(
        self.parents, "__len__"):
      raise ValueError(f"parents must be a sequence of integer node indices "
                       f"(-1 = the root), got {self.parents!r}")
    _check_count(len(self.parents), "the tree")
    for i, p in enumerate(self.parents):
      if not _is_int(p):
        raise ValueError(f"parents must be integers (-1 = the root), got "
                         f"{p!r} ({type(p).__name__}) for node {i}; parent "
                         f"indices are never converted")
    parents = tuple(int(p) for p in self.parents)
    object.__setattr__(self, "parents", parents)
    check_parents(parents)

  # -- constructors ---------------------------------------------------------

  @classmethod
  def chain(cls, gamma: int) -> "Topology":
    """gamma drafted tokens in a row (classic speculative decoding)."""
    if isinstance(gamma, bool) or not isinstance(gamma, (int, np.integer)) \
        or gamma < 1:
      raise ValueError(f"gamma must be an integer >= 1, got {gamma!r}")
    return cls(tuple(range(-1, int(gamma) - 1)))

  @classmethod
  def kary(cls, k: int, depth: int) -> "Topology":
    """A full k-ary tree of the given depth (k^1 + ... + k^depth nodes)."""
    if not (_is_int(k) and _is_int(depth)) or k < 1 or depth < 1:
      raise ValueError(f"k-ary trees need k >= 1 and depth >= 1, got k={k},"
                       f" depth={depth}")
    k, depth = int(k), int(depth)
    total = k * depth if k == 1 else (k ** (depth + 1) - k) // (k - 1)
    _check_count(total, f"Topology.kary({k}, {depth})")
    parents, level = [], [-1]
    for _ in range(depth):
      nxt = []
      for p in level:
        for _ in range(k):
          nxt.append(len(parents))
          parents.append(p)
      level = nxt
    return cls(tuple(parents))

  @classmethod
  def from_widths(cls, widths: Sequence[Sequence[int]]) -> "Topology":
    """A tree from the number of children of each node, level by level.

    ``widths[0] = [c_root]``, ``widths[d][j]`` = children of the j-th node
    of depth d (breadth-first), e.g. ``[[3], [2, 1, 0], [1, 0, 0]]``.
    """
    parents, level = [], [-1]
    for d, counts in enumerate(widths):
      if isinstance(counts, (str, bytes)) or not hasattr(counts, "__len__"):
        raise ValueError(f"widths must be a list of levels, each a list of "
                         f"child counts (e.g. [[3], [2, 1, 0]]), got "
                         f"{counts!r} at depth {d}")
      if len(counts) != len(level):
        raise ValueError(f"level has {len(level)} nodes but {len(counts)} "
                         f"child counts were given: {list(counts)}")
      for c in counts:
        if not _is_int(c) or c < 0:
          raise ValueError(f"child counts must be integers >= 0, got {c!r} "
                           f"at depth {d}: {list(counts)}")
      _check_count(len(parents) + sum(int(c) for c in counts),
                   "the tree of these widths")
      nxt = []
      for p, c in zip(level, counts):
        for _ in range(int(c)):
          nxt.append(len(parents))
          parents.append(p)
      level = nxt
    return cls(tuple(parents))

  @classmethod
  def from_paths(cls, paths: Sequence[Sequence[int]]) -> "Topology":
    """A tree from child-rank paths, e.g. [[0], [1], [0, 0], [0, 1]].

    Each path lists child ranks from the root; every prefix of a path must
    be a path too (Medusa / EAGLE "choices" format).
    """
    _check_count(len(paths), "the tree of these paths")
    seen = set()
    for p in paths:
      if isinstance(p, (str, bytes)):
        raise ValueError(f"a path must be a list of child ranks, got {p!r}")
      for r in p:
        if not _is_int(r) or r < 0:
          raise ValueError(f"path {list(p)}: ranks must be integers >= 0 "
                           f"(0 = the first child), got {r!r}")
      key = tuple(int(r) for r in p)
      if key in seen:
        raise ValueError(f"path {list(key)} is given twice; every node has "
                         f"one path")
      seen.add(key)
    paths = sorted(seen, key=lambda p: (len(p), p))
    index = {(): -1}
    parents = []
    for path in paths:
      if not path:
        continue
      if path[:-1] not in index:
        raise ValueError(f"path {list(path)} has no parent path "
                         f"{list(path[:-1])} in the list")
      if path[-1] and path[:-1] + (path[-1] - 1,) not in index:
        raise ValueError(f"path {list(path)} has no elder sibling "
                         f"{list(path[:-1]) + [path[-1] - 1]}: the ranks of "
                         f"a node's children must be 0, 1, 2, ... without "
                         f"gaps")
      index[path] = len(parents)
      parents.append(index[path[:-1]])
    return cls(tuple(parents))

  # -- static facts ---------------------------------------------------------

  @property
  def num_nodes(self) -> int:
    return len(self.parents)

  @functools.cached_property
  def depths(self) -> tuple[int, ...]:
    """Depth of every node (children of the root have depth 1)."""
    out = []
    for p in self.parents:
      out.append(1 if p < 0 else out[p] + 1)
    return tuple(out)

  @property
  def max_depth(self) -> int:
    return max(self.depths)

  @functools.cached_property
  def children(self) -> tuple[tuple[int, ...], ...]:
    """Children of the root (entry 0) and of node i (entry i + 1), by rank."""
    out = [[] for _ in range(self.num_nodes + 1)]
    for i, p in enumerate(self.parents):
      out[p + 1].append(i)
    return tuple(tuple(c) for c in out)

  @property
  def max_children(self) -> int:
    return max(len(c) for c in self.children)

  @functools.cached_property
  def ranks(self) -> tuple[int, ...]:
    """Rank of every node among its siblings (0 = first)."""
    return tuple(self.children[p + 1].index(i)
                 for i, p in enumerate(self.parents))

  @property
  def is_chain(self) -> bool:
    return self.parents == tuple(range(-1, self.num_nodes - 1))

  def block_mask(self) -> np.ndarray:
    """[N + 1, N + 1] bool: block token i attends to block token j.

    Block index 0 is the root, block index i + 1 node i; a token attends to
    itself and its ancestors.
    """
    n = self.num_nodes + 1
    mask = np.eye(n, dtype=bool)
    mask[:, 0] = True
    for i, p in enumerate(self.parents):
      mask[i + 1] |= mask[p + 1]
    return mask

  def block_depths(self) -> np.ndarray:
    """[N + 1] int32 depth of every block token (root 0)."""
    return np.asarray((0,) + self.depths, np.int32)

  def __repr__(self) -> str:
    if self.is_chain:
      return f"Topology.chain({self.num_nodes})"
    return f"Topology(parents={self.parents})"


def check_parents(parents: Sequence[int]) -> None:
  """Raises ValueError unless ``parents`` is a breadth-first tree.

  Args:
    parents: ``parents[i]`` is the parent of node i (-1 = the root).
  """
  if not parents:
    raise ValueError("a draft tree needs at least one node, got zero nodes")
  for i, p in enumerate(parents):
    if p >= i:
      raise ValueError(
          f"node {i} has parent {p}, which is not an earlier node: parents "
          f"must come before their children (a parent index after its child,"
          f" or a cycle); number nodes breadth-first")
    if p < -1:
      raise ValueError(f"node {i} has parent {p}; use -1 for the root")
  depths = []
  for p in parents:
    depths.append(1 if p < 0 else depths[p] + 1)
  if any(a > b for a, b in zip(depths, depths[1:])):
    i = next(j for j in range(1, len(depths)) if depths[j - 1] > depths[j])
    raise ValueError(f"node {i} (depth {depths[i]}) comes after a node of "
                     f"depth {depths[i - 1]}: number nodes breadth-first")
