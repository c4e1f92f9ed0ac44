"""Bad trees and unsupported combinations fail before anything runs."""

import pytest

from specdec_jax import decoding
from specdec_jax.decoding.loops import program as program_lib
from tests.decoding import fakes

Topology = decoding.Topology


@pytest.mark.parametrize("parents,match", [
    ((), "at least one node, got zero nodes"),
    ((-1, 2, 0), "node 1 has parent 2, which is not an earlier node"),
    ((-1, 1), "node 1 has parent 1"),  # a cycle (its own parent)
    ((1, 0), "node 0 has parent 1, which is not an earlier node"),  # 0 <-> 1
    ((-1, 0, -1), "node 2 \\(depth 1\\) comes after a node of depth 2: "
                  "number nodes breadth-first"),
    ((-1, -3), "node 1 has parent -3; use -1 for the root"),
])
def test_malformed_topologies(parents, match):
  with pytest.raises(ValueError, match=match):
    decoding.Tree(Topology(parents))


@pytest.mark.parametrize("build,match", [
    (lambda: Topology.from_paths([[0], [1, 0]]),
     "path \\[1, 0\\] has no parent path \\[1\\] in the list"),
    (lambda: Topology.from_widths([[2], [1, 1, 1]]),
     "level has 2 nodes but 3 child counts were given: \\[1, 1, 1\\]"),
    (lambda: Topology.from_widths([[0]]), "got zero nodes"),
    (lambda: Topology.kary(0, 2),
     "k-ary trees need k >= 1 and depth >= 1, got k=0, depth=2"),
    (lambda: Topology.chain(0), "gamma must be an integer >= 1, got 0"),
    # Issue 43: each of these became some other tree before.
    (lambda: Topology((-1, 0.7)), r"parents must be integers \(-1 = the "
     r"root\), got 0.7 \(float\) for node 1; parent indices are never "
     r"converted"),
    (lambda: Topology(("-1", "0")), r"got '-1' \(str\) for node 0"),
    (lambda: Topology((-1, True)), r"got True \(bool\) for node 1"),
    (lambda: Topology("-10"), "parents must be a sequence of integer node "
     "indices"),
    (lambda: Topology.from_paths([[0], [0], [1]]),
     r"path \[0\] is given twice; every node has one path"),
    (lambda: Topology.from_paths([[-1]]),
     r"path \[-1\]: ranks must be integers >= 0 \(0 = the first child\), "
     r"got -1"),
    (lambda: Topology.from_paths([[0.5]]), "ranks must be integers >= 0 "
     r"\(0 = the first child\), got 0.5"),
    (lambda: Topology.from_paths([[0], [2]]),
     r"path \[2\] has no elder sibling \[1\]: the ranks of a node's "
     r"children must be 0, 1, 2, ... without gaps"),
    (lambda: Topology.from_widths([[2], [1, -1]]), "child counts must be "
     r"integers >= 0, got -1 at depth 1: \[1, -1\]"),
    (lambda: Topology.from_widths([[1.5]]), "got 1.5 at depth 0"),
    (lambda: Topology.from_widths([2, 1]), "widths must be a list of levels, "
     "each a list of child counts \\(e.g. \\[\\[3\\], \\[2, 1, 0\\]\\]\\), got 2 "
     "at depth 0"),
    (lambda: Topology.kary(2.0, 2), "k-ary trees need k >= 1"),
    # Size limits, counted before anything is built (no 66 GiB mask).
    (lambda: Topology.kary(64, 3), r"Topology.kary\(64, 3\) has 266,304 "
     r"nodes, more than the limit of 4,096 \(topology.MAX_NODES\)"),
    (lambda: Topology.kary(2, 30), "has 2,147,483,646 nodes, more than the "
     "limit of 4,096"),
    (lambda: Topology.from_widths([[5000]]), "the tree of these widths has "
     "5,000 nodes"),
    (lambda: Topology(tuple(range(-1, 4999))), "the tree has 5,000 nodes"),
])
def test_bad_topology_constructors(build, match):
  with pytest.raises(ValueError, match=match):
    build()


def test_the_largest_tree_builds():
  topo = Topology.from_widths([[4096]])
  assert topo.num_nodes == 4096 and topo.block_mask().nbytes == 4097 ** 2


def test_bad_tree_objects():
  with pytest.raises(ValueError, match="unknown tree proposal 'gumbel'"):
    decoding.Tree(Topology.kary(2, 2), proposal="gumbel")
  with pytest.raises(ValueError, match="drafter_sync must be one of"):
    decoding.Tree(Topology.kary(2, 2), drafter_sync="lazy")
  with pytest.raises(ValueError, match="Tree needs a Topology"):
    decoding.Tree("kary")
  assert decoding.Tree([-1, -1, 0]).shape == (3, 2, 2)  # parent list


def _gen(method, tree, **kw):
  drafter = verifier = fakes.plus_one(vocab=16)
  kw.setdefault("max_new_tokens", 4)
  return decoding.generate(method, drafter, verifier, {}, {}, [[2, 3]],
                           tree=tree, **kw)


@pytest.mark.parametrize("method,match", [
    (decoding.make_method("bild"), "BiLD does not run on draft trees"),
    (decoding.TargetOnly(), "TargetOnly does not run on draft trees"),
    (decoding.make_method("token_cascade"), "TokenCascade does not run"),
    (decoding.make_method("oracle_diff"), "does not run on draft trees"),
])
def test_methods_without_trees_are_rejected(method, match):
  with pytest.raises(ValueError, match=match):
    _gen(method, decoding.Tree(Topology.kary(2, 2)))


def test_unsupported_combinations_are_rejected_before_compiling():
  before = len(program_lib._COMPILED)  # pylint: disable=protected-access
  spec = decoding.make_method("spec_decode")
  with pytest.raises(ValueError, match="a node with 17 children but the "
                     "vocabulary has only 16 tokens"):
    _gen(spec, decoding.Tree(Topology.kary(17, 1)))
  with pytest.raises(ValueError, match="LossyGreedy is greedy: i.i.d. "
                     "children .* use proposal='top_k'"):
    _gen(decoding.make_method("lossy_greedy"),
         decoding.Tree(Topology.kary(2, 2), "iid"))
  with pytest.raises(ValueError, match="LossyGreedy is a greedy method"):
    _gen(decoding.make_method("lossy_greedy"),
         decoding.Tree(Topology.kary(2, 2), "top_k"),
         sampling=decoding.Temperature(1.0))
  with pytest.raises(ValueError, match="drafter_sync='catchup' .* TokenV3 "
                     "reads q there"):
    _gen(decoding.make_method("token_v3"),
         decoding.Tree(Topology.kary(2, 2), drafter_sync="catchup"))
  with pytest.raises(ValueError, match="tree must be a decoding.Tree"):
    _gen(spec, "kary")
  # Depth/size beyond the cache: the tree's nodes count against it.
  with pytest.raises(ValueError, match="the tree's 30 nodes \\+ 3 = 50 "
                     "cache slots exceed max_cache_length \\(40\\)"):
    _gen(spec, decoding.Tree(Topology.chain(30)), max_cache_length=40,
         max_new_tokens=1)
  assert len(program_lib._COMPILED) == before  # pylint: disable=protected-access


def test_a_topology_is_a_tree_with_the_default_proposal():
  out = _gen(decoding.make_method("spec_decode"), Topology.chain(2),
             max_new_tokens=5, eos_id=None)
  assert out.sequences() == [[4, 5, 6, 7, 8]]
  assert out.verifier_calls.tolist() == [2]  # 3 tokens, then 2 (budget)
