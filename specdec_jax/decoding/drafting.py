"""How a fixed set of models drafts: :class:`Drafting` (host side, static).

An adapter that traces the decode loop itself (the t5x Models, a serving
engine) holds its models once and decodes many batches with one structure.
``Drafting`` is that resolved, hashable choice: the levels (cheapest first),
which parameter tree each level reads, and the structure (Chain / Tree /
Stack). It builds the same :class:`~strategy.Strategy` and runs the same
program builder as :func:`request.decode`; only the Batch comes from the
caller (built inside its trace).

    d = resolve(method, models=(drafter, verifier), param_keys=("draft",
                "target"), structure=Chain(4))
    cfg = d.config(method, max_new=64, eos_id=1, sampling=static)
    out = d.run(method, {"draft": qp, "target": pp}, batch, cfg)
"""

from __future__ import annotations

import dataclasses

from specdec_jax.decoding import methods as methods_lib
from specdec_jax.decoding import request
from specdec_jax.decoding.hierarchy.stack import StackShape, check_levels
from specdec_jax.decoding.loops import tree as tree_loop
from specdec_jax.decoding.loops.program import run_program
from specdec_jax.decoding.loops.state import Batch, LoopConfig
from specdec_jax.decoding.strategy import (Chain, Stack, Strategy, Tree,
                                           as_structure)
from specdec_jax.decoding.verify.topology import Topology


@dataclasses.dataclass(frozen=True)
class Drafting:
  """The resolved drafting of a fixed set of models (static, hashable).

  Attributes:
    models: the levels, cheapest first (drafter, ..., verifier).
    param_keys: for each level, the key of its params in the caller's
      parameter dict (t5x: 'draft' / 'target').
    structure: Chain / Tree / Stack.
  """

  models: tuple
  param_keys: tuple[str, ...]
  structure: Chain | Tree | Stack

  @property
  def kind(self) -> str:
    """'tree', 'hierarchy' or 'chain'."""
    if isinstance(self.structure, Tree):
      return "tree"
    return "hierarchy" if isinstance(self.structure, Stack) else "chain"

  @property
  def tree(self) -> Tree | None:
    """The draft tree, or None."""
    return self.structure if isinstance(self.structure, Tree) else None

  @property
  def stack(self) -> StackShape | None:
    """The hierarchy's static shape, or None."""
    if not isinstance(self.structure, Stack):
      return None
    return StackShape(buffers=self.structure.buffers)

  def strategy(self, method, sampling=None) -> Strategy:
    """The strategy of ``method`` on this drafting."""
    return Strategy(method, self.structure, sampling)

  def config(self, method, **fields) -> LoopConfig:
    """The static LoopConfig (a TreeConfig for trees) of one call.

    ``fields``: max_new, eos_id, pad_id, sampling (the static half).
    """
    return request.loop_config(self.strategy(method),
                               self.models[-1].vocab_size, **fields)

  def run(self, method, params, batch: Batch, cfg: LoopConfig):
    """Runs the decode loop on ``batch`` (traced or eager).

    Args:
      method: the method.
      params: dict of parameter trees (``param_keys`` index it).
      batch: the Batch of the call ([N] rows).
      cfg: ``self.config(method, ...)``.

    Returns:
      LoopOutput ([N] rows; ``levels`` cheapest first).
    """
    strategy = self.strategy(method)
    level_params = tuple(params[k] for k in self.param_keys)
    batch = request.with_structure(batch, strategy, cfg)
    program = request.build_program(strategy, self.models, cfg)
    return run_program(program, (level_params, batch))


def resolve(method, models: tuple, param_keys: tuple[str, ...],
            structure) -> Drafting:
  """Checks a drafting (host side) and returns it.

  Every bad combination is a ValueError here, before anything is traced.

  Args:
    method: the method object.
    models: the levels, cheapest first (2 for a chain or a tree).
    param_keys: one key per level.
    structure: Chain / Tree / Stack (a Topology is a Tree).
  """
  structure = as_structure(structure)
  models, param_keys = tuple(models), tuple(param_keys)
  if isinstance(structure, Tree):
    tree_loop.make_config(structure, method, models[-1].vocab_size,
                          max_new=1, eos_id=None)  # method/proposal/vocab
  if isinstance(structure, Stack):
    if not isinstance(method, methods_lib.Speculative):
      raise ValueError(f"a hierarchy's top level verifies with a "
                       f"speculative method (spec_decode, lossy, a cascade "
                       f"rule), got {type(method).__name__}")
    check_levels([(m, None) for m in models], structure.buffers)
  return Drafting(models=models, param_keys=param_keys, structure=structure)


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
