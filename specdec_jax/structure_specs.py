"""gin-configurable draft structures of ``run`` (decode): a tree, a
hierarchy, or one strategy value (``run.strategy = @chain()``, ``@tree()``,
``@stack()``).

Split from ``main.py`` (the entry point, which imports it so gin knows
them); gin/trees/*.gin and gin/hierarchies/*.gin bind these.
"""

from __future__ import annotations

import gin

from specdec_jax import decoding
from specdec_jax import hierarchy_spec as hierarchy_lib


@gin.configurable
def tree_spec(parents=None, paths=None, kary=None, chain=None,
              proposal: str = "without_replacement",
              drafter_sync: str = "auto"):
  """A draft tree (decode with tree verification; gin/trees/*.gin).

  Exactly one of: ``parents`` (parent index of every node, -1 = root,
  breadth-first), ``paths`` (child-rank paths, e.g. [[0], [1], [0, 0]]),
  ``kary`` ((k, depth): a full k-ary tree) or ``chain`` (gamma).
  """
  given = {k: v for k, v in dict(parents=parents, paths=paths, kary=kary,
                                   chain=chain).items() if v is not None}
  if len(given) != 1:
    raise ValueError(f"tree_spec needs exactly one of parents, paths, kary, "
                     f"chain; got {sorted(given) or 'none'}")
  (kind, value), = given.items()
  topo = {"parents": lambda x: decoding.Topology(tuple(x)),
          "paths": decoding.Topology.from_paths,
          "kary": lambda x: decoding.Topology.kary(*x),
          "chain": decoding.Topology.chain}[kind](value)
  return decoding.Tree(topo, proposal=proposal, drafter_sync=drafter_sync)


@gin.configurable
def hierarchy_spec(drafters=gin.REQUIRED, buffers=gin.REQUIRED, lenient=None):
  """A hierarchy under the run's verifier (decode; gin/hierarchies/*.gin).

  ``drafters``: levels 0..K-1, cheapest first, each a ModelSpec
  (``@scope/ModelSpec()``) or ``'exit:K'`` (the verifier's first K decoder
  layers); ``buffers``: [T_0, ..., T_{K-1}]; ``lenient``: optional
  {level n in 1..K-1: @scope/method_spec()} cascade rules of intermediate
  levels (the top method must then be spec_decode).
  """
  return hierarchy_lib.HierarchySpec(drafters, buffers, lenient or ())


# The draft structure as one value: ``run.strategy = @chain()``, ``@tree()``
# or ``@stack()`` (instead of run.gamma / run.tree / run.hierarchy).


@gin.configurable("chain")
def chain_strategy(gamma: int = 5):
  """A chain of ``gamma`` drafted tokens per block (decoding.Chain)."""
  return decoding.Chain(gamma)


@gin.configurable("tree")
def tree_strategy(parents=None, paths=None, kary=None, chain=None,
                  proposal: str = "without_replacement",
                  drafter_sync: str = "auto"):
  """A draft tree (decoding.Tree); the arguments of ``tree_spec``."""
  return tree_spec(parents=parents, paths=paths, kary=kary, chain=chain,
                   proposal=proposal, drafter_sync=drafter_sync)


@gin.configurable("stack")
def stack_strategy(drafters=gin.REQUIRED, buffers=gin.REQUIRED,
                   lenient=None):
  """A stack of drafters under the verifier; the arguments of
  ``hierarchy_spec`` (the levels' ModelSpecs are part of it)."""
  return hierarchy_spec(drafters=drafters, buffers=buffers, lenient=lenient)


def structure_args(strategy, gamma: int, tree, hierarchy):
  """(gamma, tree, hierarchy) of ``run`` with ``run.strategy`` applied."""
  if strategy is None:
    return gamma, tree, hierarchy
  if tree is not None or hierarchy is not None:
    raise ValueError("set run.strategy OR run.tree / run.hierarchy, not "
                     "both (run.strategy = @chain(), @tree() or @stack())")
  if isinstance(strategy, decoding.Chain):
    return strategy.gamma, None, None
  if isinstance(strategy, decoding.Tree):
    return gamma, strategy, None
  if isinstance(strategy, hierarchy_lib.HierarchySpec):
    return gamma, None, strategy
  raise ValueError(f"run.strategy must be @chain(), @tree() or @stack(), "
                   f"got {type(strategy).__name__}")
