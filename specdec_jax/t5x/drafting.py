"""How the t5x Models draft: a chain, a token tree, or a hierarchy.

The speculative Models (``models.py``) hold ONE parameter tree
``{'draft': ..., 'target': ...}``, restored by t5x from one (merged)
checkpoint. Within that contract a Model drafts in one of three ways:

* a chain of ``gamma`` tokens per block (the default; ``decoding.generate``
  with ``gamma``);
* a token tree per block, verified in ONE verifier step by exact recursive
  rejection sampling (``tree=decoding.Tree(...)``, as
  ``decoding.generate(..., tree=...)``; docs/trees.md);
* a hierarchy: the drafter, then early exits of the verifier, then the
  verifier (``hierarchy=Hierarchy(exits=(k, ...), buffers=(T_0, ...))``, as
  ``decoding.hierarchy.api.generate_hierarchy``). An early exit runs the
  verifier's first k decoder layers with the verifier's own parameters
  (``models.early_exit``), so the intermediate levels need no parameters of
  their own and the t5x parameter tree stays ``{'draft', 'target'}``::

      level 0   drafter                       params['draft']
      level 1   early_exit(verifier, exits[0])  params['target']
      ...
      level K   verifier                      params['target']

Everything here is host-side and static (it runs when the Model is built or
traced); :meth:`Drafting.run` runs the loop inside t5x's trace.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from specdec_jax import models as models_lib
from specdec_jax.decoding import methods as methods_lib
from specdec_jax.decoding.hierarchy import loop as hierarchy_loop
from specdec_jax.decoding.hierarchy.api import check_levels
from specdec_jax.decoding.hierarchy.stack import Stack
from specdec_jax.decoding.loops import tree as tree_loop
from specdec_jax.decoding.loops.program import run_program
from specdec_jax.decoding.loops.state import Batch, LoopConfig
from specdec_jax.decoding.rules.knobs import split
from specdec_jax.decoding.verify.topology import Topology
from specdec_jax.decoding.verify.tree import Tree


@dataclasses.dataclass(frozen=True)
class Hierarchy:
  """Extra draft levels of a t5x Model: early exits of its verifier.

  In gin::

      specdec_jax.t5x.models.SpeculativeEncoderDecoderModel.hierarchy = \\
          @specdec_jax.t5x.models.Hierarchy()
      specdec_jax.t5x.models.Hierarchy.exits = (2,)
      specdec_jax.t5x.models.Hierarchy.buffers = (3, 6)

  Attributes:
    exits: decoder layers run by each intermediate level, cheapest first:
      strictly increasing, each in [1, verifier layers - 1]. Level n (n =
      1..K-1) is ``models.early_exit(verifier, exits[n - 1])`` and reads
      params['target'].
    buffers: (T_0, ..., T_{K-1}), one per level below the verifier
      (``len(exits) + 1`` values >= 1): the drafter drafts T_0 tokens per
      batch; level n accumulates verified tokens until it holds >= T_n.
  """

  exits: Sequence[int]
  buffers: Sequence[int]

  def __post_init__(self):
    for name in ("exits", "buffers"):
      value = getattr(self, name)
      if isinstance(value, (int, np.integer, str)) or not all(
          isinstance(x, (int, np.integer)) and not isinstance(x, bool)
          for x in value):
        raise ValueError(f"Hierarchy.{name} must be a sequence of integers, "
                         f"got {value!r}")
      object.__setattr__(self, name, tuple(int(x) for x in value))
    if not self.exits:
      raise ValueError("Hierarchy.exits is empty: a hierarchy adds at least "
                       "one early exit of the verifier between the drafter "
                       "and the verifier (without one, set gamma instead)")
    if any(b <= a for a, b in zip(self.exits, self.exits[1:])):
      raise ValueError(f"Hierarchy.exits must be strictly increasing "
                       f"(cheapest level first), got {list(self.exits)}")
    if len(self.buffers) != len(self.exits) + 1:
      raise ValueError(
          f"Hierarchy with {len(self.exits)} exit(s) has "
          f"{len(self.exits) + 2} levels and needs {len(self.exits) + 1} "
          f"buffers (T_0 for the drafter, one per exit), got "
          f"{list(self.buffers)}")
    if min(self.buffers) < 1:
      raise ValueError(f"Hierarchy.buffers must all be >= 1, got "
                       f"{list(self.buffers)}")

  def models(self, drafter, verifier) -> tuple:
    """(drafter, early exits..., verifier): the levels, cheapest first."""
    if not isinstance(verifier, models_lib.FlaxDecodeModel):
      raise ValueError(f"a Hierarchy's exits are early exits of the "
                       f"verifier, which must be a T5Model or GemmaModel, "
                       f"got {type(verifier).__name__}")
    layers = verifier.depth
    bad = [k for k in self.exits if not 1 <= k < layers]
    if bad:
      raise ValueError(
          f"Hierarchy exit {bad[0]} is outside [1, {layers - 1}]: the "
          f"verifier has {layers} decoder layers and an exit runs fewer "
          f"(an exit at {layers} would be the verifier itself)")
    exits = tuple(models_lib.early_exit(verifier, k) for k in self.exits)
    return (drafter,) + exits + (verifier,)


def as_tree(tree) -> Tree:
  """A ``decoding.Tree`` from a Tree, a Topology or a list of parents."""
  if isinstance(tree, Tree):
    return tree
  if isinstance(tree, Topology):
    return Tree(tree)
  if isinstance(tree, (list, tuple)):
    return Tree(Topology(tuple(tree)))
  raise ValueError(f"tree must be a decoding.Tree, a decoding.Topology or a "
                   f"list of parent indices (-1 = root), got "
                   f"{type(tree).__name__}")


@dataclasses.dataclass(frozen=True)
class Drafting:
  """The resolved drafting of a Model (static, hashable).

  Attributes:
    models: the levels, cheapest first (drafter, ..., verifier).
    param_keys: for each level, the key of its params ('draft'/'target').
    topology: the chain of ``gamma`` (chain and hierarchy drafting).
    tree: the draft tree, or None.
    stack: the hierarchy's Stack, or None.
  """

  models: tuple
  param_keys: tuple[str, ...]
  topology: Topology
  tree: Tree | None = None
  stack: Stack | None = None

  @property
  def kind(self) -> str:
    """'tree', 'hierarchy' or 'chain'."""
    if self.tree is not None:
      return "tree"
    return "hierarchy" if self.stack is not None else "chain"

  def config(self, method, **fields) -> LoopConfig:
    """The static LoopConfig (a TreeConfig for trees) of one call."""
    if self.tree is not None:
      return tree_loop.make_config(self.tree, method,
                                   self.models[-1].vocab_size, **fields)
    return LoopConfig(topology=self.topology, **fields)

  def run(self, method, params, batch: Batch, cfg: LoopConfig):
    """Runs the decode loop on ``batch`` (traced or eager).

    Args:
      method: the Model's method.
      params: the Model's {'draft': ..., 'target': ...}.
      batch: the Batch of the call ([N] rows).
      cfg: ``self.config(method, ...)``.

    Returns:
      LoopOutput ([N] rows; ``levels`` cheapest first).
    """
    level_params = tuple(params[k] for k in self.param_keys)
    if self.stack is not None:
      program = hierarchy_loop.program(self.models, cfg, self.stack,
                                       split(method.target)[0])
    else:
      if self.tree is not None:
        batch = tree_loop.add_tree(batch, cfg.topology)
      program = method.program(self.models, cfg)
    return run_program(program, (level_params, batch))


def resolve(method, drafter, verifier, gamma: int, tree=None,
            hierarchy: Hierarchy | None = None) -> Drafting:
  """Checks a Model's drafting options and resolves them (host side).

  Every bad combination is a ValueError here, when the Model is built,
  before anything is traced or compiled.

  Args:
    method: the Model's method object.
    drafter, verifier: its models.
    gamma: the chain's draft block size (ignored by trees/hierarchies).
    tree: optional Tree / Topology / parent list.
    hierarchy: optional :class:`Hierarchy`.

  Returns:
    Drafting.
  """
  chain = Topology.chain(gamma)
  pair = dict(models=(drafter, verifier), param_keys=("draft", "target"),
              topology=chain)
  if tree is not None and hierarchy is not None:
    raise ValueError("set at most one of tree and hierarchy: a hierarchy's "
                     "levels draft chains, a tree is verified by one model")
  if tree is not None:
    tree = as_tree(tree)
    tree_loop.make_config(tree, method, verifier.vocab_size, max_new=1,
                          eos_id=None)  # method / proposal / vocab checks
    return Drafting(tree=tree, **pair)
  if hierarchy is None:
    return Drafting(**pair)
  if not isinstance(hierarchy, Hierarchy):
    raise ValueError(f"hierarchy must be a specdec_jax.t5x.models.Hierarchy"
                     f"(exits=..., buffers=...), got "
                     f"{type(hierarchy).__name__}")
  if not isinstance(method, methods_lib.Speculative):
    raise ValueError(f"a hierarchy's top level verifies with a speculative "
                     f"method (spec_decode, lossy, a cascade rule), got "
                     f"{type(method).__name__}")
  levels = hierarchy.models(drafter, verifier)
  _, _, buffers = check_levels([(m, None) for m in levels],
                               hierarchy.buffers)
  keys = ("draft",) + ("target",) * (len(levels) - 1)
  return Drafting(models=levels, param_keys=keys, topology=chain,
                  stack=Stack(buffers=buffers))
