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


def test_program_hash_tells_same_from_changed_device_programs():
  import types
  import jax
  import jax.numpy as jnp
  mod = load_script("bench_ab", "bench_ab_under_test")

  class Double:
    def __call__(self, args):
      return args * 2

  class Triple:
    def __call__(self, args):
      return args * 3

  api = types.SimpleNamespace(run_program=lambda program, args, mesh=None:
                              program(args))
  seen = mod._record_programs(types.SimpleNamespace(api=api))
  assert mod._program_hash(jax, seen) is None  # nothing ran yet
  x = jnp.ones(3)
  assert float(api.run_program(Double(), x)[0]) == 2.0  # still runs it
  first = mod._program_hash(jax, seen)
  seen.clear()
  api.run_program(Double(), x)
  assert mod._program_hash(jax, seen) == first  # another process would agree
  seen.clear()
  api.run_program(Triple(), x)
  assert mod._program_hash(jax, seen) not in (None, first)
  seen.clear()
  api.run_program(Double(), jnp.ones(4))  # other shapes: another program
  assert mod._program_hash(jax, seen) != first
  # A checkout without api.run_program records nothing (hash None).
  assert mod._record_programs(types.SimpleNamespace()) == []


def test_rounds_alternate_which_checkout_runs_first():
  mod = load_script("bench_ab", "bench_ab_under_test")
  sides = [[side for side, _ in mod.round_order(r, "a/", "b/")]
           for r in range(4)]
  assert sides == [["A", "B"], ["B", "A"], ["A", "B"], ["B", "A"]]
  assert dict(mod.round_order(1, "a/", "b/")) == {"A": "a/", "B": "b/"}
