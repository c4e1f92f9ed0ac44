"""The strategy value and the one request path (issue 38): every structure
is one typed value, ``decode`` runs each, and the legacy entry points are
thin wrappers with the same results."""

import pytest

from specdec_jax import decoding
from specdec_jax.eval import drafts
from tests.decoding.fakes import plus_one, plus_one_except

Topology = decoding.Topology


def test_structures_are_hashable_values_with_clear_errors():
  s = decoding.Strategy.of("token_v3", decoding.Chain(3), alpha=0.3)
  assert s == decoding.Strategy(decoding.make_method("token_v3", alpha=0.3),
                                decoding.Chain(3), decoding.Greedy())
  assert hash(s) == hash(s.replace()) and s.kind == "chain"
  assert decoding.Strategy(s.method).structure == decoding.Chain(5)
  tree = decoding.Strategy(s.method, Topology.kary(2, 2))
  assert tree.structure == decoding.Tree(Topology.kary(2, 2)) and (
      tree.kind == "tree")
  stack = decoding.Stack([2, 3, 1], lenient={2: s.method})
  assert stack.lenient == (None, s.method) and stack.depth == 3
  assert stack.lenient_map() == {2: s.method}
  with pytest.raises(ValueError, match="gamma must be an integer >= 1"):
    decoding.Chain(0)
  with pytest.raises(ValueError, match="buffer T_1 must be an integer"):
    decoding.Stack((2, 0))
  with pytest.raises(ValueError, match="lenient levels are the "
                     "intermediate ones, 1..1; got level 2"):
    decoding.Stack((2, 2), lenient={2: s.method})
  with pytest.raises(ValueError, match="a draft structure is"):
    decoding.Strategy(s.method, "kary")


def test_decode_runs_every_structure_like_the_wrappers():
  """Chain, tree and stack through ``decode`` give the wrappers' tokens
  (the +1 models of the hand-traced hierarchy test)."""
  m = plus_one()
  spec = decoding.make_method("spec_decode")
  kw = dict(max_new_tokens=6, eos_id=None)
  for structure in (decoding.Chain(3), decoding.Tree(Topology.kary(2, 2))):
    out = decoding.decode(decoding.Strategy(spec, structure), (m, m), ({}, {}),
                          [[2, 3]], **kw)
    assert out.sequences() == [[4, 5, 6, 7, 8, 9]]
  levels = [plus_one_except([4]), plus_one_except([6]), plus_one()]
  out = decoding.decode(decoding.Strategy(spec, decoding.Stack((2, 3))),
                        levels, [{}] * 3, [[2, 3]], max_new_tokens=10,
                        eos_id=None)
  ref = decoding.generate_hierarchy([(lv, {}) for lv in levels], [2, 3],
                                    [[2, 3]], max_new_tokens=10, eos_id=None)
  assert out.sequences() == ref.sequences() == [list(range(4, 14))]
  assert out.calls.tolist() == ref.calls.tolist() == [[8, 4, 3]]


def test_decode_rejects_mismatched_levels_and_options():
  m = plus_one()
  spec = decoding.make_method("spec_decode")
  with pytest.raises(ValueError, match="a chain or a tree decodes with "
                     "\\(drafter, verifier\\)"):
    decoding.decode(decoding.Strategy(spec), (m, m, m), ({}, {}, {}), [[2]])
  with pytest.raises(ValueError, match="return_trace=True records draft "
                     "blocks; a stack drafts none"):
    decoding.decode(decoding.Strategy(spec, decoding.Stack((2,))), (m, m),
                    ({}, {}), [[2]], return_trace=True)
  with pytest.raises(ValueError, match="the top level verifies with a "
                     "speculative method"):
    decoding.decode(decoding.Strategy(decoding.TargetOnly(),
                                      decoding.Stack((2,))), (m, m),
                    ({}, {}), [[2]])


def test_harness_fields_parse_into_the_structure_value():
  assert drafts.structure((), "", 0) == decoding.Chain(1)
  assert drafts.structure((), "", 4) == decoding.Chain(4)
  assert drafts.structure((3, 6), "", 0) == decoding.Stack((3, 6))
  assert drafts.structure((), "kary:2,3/top_k", 0) == decoding.Tree(
      Topology.kary(2, 3), "top_k")
