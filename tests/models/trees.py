"""Token trees given by parent pointers, for the tree-step tests."""

import numpy as np

# Trees of 7 nodes; parent -1 = a child of the cached prefix.
CHAIN = (-1, 0, 1, 2, 3, 4, 5)
WIDE = (-1, 0, 0, 0, 0, 0, 0)
DEEP = (-1, 0, 1, 1, 2, 4, 5)  # two branches, one 6 deep
FOREST = (-1, -1, 1, 0, 2, 4, 3)  # two roots


def layout(parents):
  """(depth [N] int32, ancestor-or-self mask [N, N] bool) of a tree.

  Args:
    parents: parent index of every node (< its own index), -1 for roots.
  """
  n = len(parents)
  depth = np.zeros(n, np.int32)
  mask = np.eye(n, dtype=bool)
  for i, p in enumerate(parents):
    assert p < i, "parents must come before their children"
    if p >= 0:
      depth[i] = depth[p] + 1
      mask[i] |= mask[p]
  return depth, mask


def path_to(parents, node):
  """Block indices of the root-to-``node`` path, ascending."""
  path = []
  while node >= 0:
    path.append(node)
    node = parents[node]
  return path[::-1]


def test_layout_worked_example():
  depth, mask = layout(DEEP)
  np.testing.assert_array_equal(depth, [0, 1, 2, 2, 3, 4, 5])
  assert mask[6].nonzero()[0].tolist() == [0, 1, 2, 4, 5, 6]
  assert path_to(DEEP, 6) == [0, 1, 2, 4, 5, 6]
  assert path_to(FOREST, 6) == [0, 3, 6]
