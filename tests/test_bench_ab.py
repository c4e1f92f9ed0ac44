"""scripts/bench_ab.py: its irregular-tree cases (the timed run itself is a
benchmark, not a test)."""

from specdec_jax.decoding.verify import tree as tree_lib
from specdec_jax.decoding.verify.topology import Topology
from tests import load_script


def test_plan16_cases_are_the_planners_irregular_trees():
  mod = load_script("bench_ab", "bench_ab_under_test")
  assert set(mod.PLAN16) == set(mod.FAMILIES)
  shapes = {f: Topology(p) for f, p in mod.PLAN16.items()}
  assert {f: (t.num_nodes, t.max_depth, t.max_children)
          for f, t in shapes.items()} == {"default-gemma": (16, 6, 2),
                                           "default-t5": (16, 6, 6)}
  # Exact level sizes vs the (N, D, C) bounds the loop used to compile.
  assert tree_lib.level_sizes(shapes["default-t5"]) == (1, 6, 3, 4, 1, 1, 1)
  assert tree_lib.level_bounds(16, 6, 6) == (1, 6, 11, 11, 11, 11, 11)
