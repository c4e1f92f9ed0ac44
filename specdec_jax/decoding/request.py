"""The steps of the one request path, ``api.decode(strategy, models, ...)``.

Every decode of the engine runs through these, whatever its structure:

    decode(strategy, models, params, prompts, ...)
      check(strategy, models)         method, sampling, models fit together
      prepare(...)                    prompts -> checked, padded Batch (the
                                      ONE request prep; ``inputs.py``)
      loop_config(...)                static LoopConfig (TreeConfig: shape)
      with_structure(batch, ...)      Batch.structure: TreeArrays /
                                      StackKnobs / None
      build_program(strategy, ...)    the ONE dispatch on the structure:
        Chain -> method.program(models, cfg)      (loops/speculative.py,
                                                   or a sequential loop)
        Tree  -> tree_program(models, TreeConfig, method.rule())
                 (loops/tree.py; a chain-shaped tree: chain_program)
        Stack -> hierarchy_program(...)           (hierarchy/loop.py)
      check_memory / check_capacity               (budget.py)
      run_program(program, (params, batch))        (loops/program.py)
      -> DecodeResult                              (result.py)

``decode`` itself lives in api.py with ``generate``; ``generate`` and
``generate_hierarchy`` (hierarchy/api.py) are thin wrappers that build the
:class:`~strategy.Strategy` and call it; the t5x Models build their Batch
inside their own trace and call :func:`build_program` through
``drafting.Drafting``.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from specdec_jax.decoding import inputs as inputs_lib
from specdec_jax.decoding import methods as methods_lib
from specdec_jax.decoding.hierarchy.loop import hierarchy_program
from specdec_jax.decoding.hierarchy.stack import StackShape, check_levels
from specdec_jax.decoding.loops import speculative
from specdec_jax.decoding.loops import tree as tree_loop
from specdec_jax.decoding.loops.program import LoopProgram
from specdec_jax.decoding.loops.state import Batch, LoopConfig
from specdec_jax.decoding.loops.structure_data import StackKnobs, TreeArrays
from specdec_jax.decoding.rules import targets
from specdec_jax.decoding.rules.knobs import split
from specdec_jax.decoding.strategy import Chain, Stack, Strategy, Tree


def stack_shape(stack: Stack, top) -> tuple[StackShape, tuple[dict, ...]]:
  """(static shape, per-level knob dicts) of a stack whose top level
  verifies with the speculative method ``top``."""
  rules, knobs = [], []
  for n, method in enumerate(stack.lenient, 1):
    if method is None:
      rules.append(None)
      knobs.append({})
      continue
    if not isinstance(method, methods_lib.Speculative) or getattr(
        method, "target", None) is None:
      raise ValueError(f"lenient level {n} needs a speculative method (e.g. "
                       f"make_method('token_v3', alpha=0.5)), got "
                       f"{type(method).__name__}")
    method.validate()
    static, k = split(method.target)
    rules.append(static)
    knobs.append(k)
  if any(r is not None for r in rules) and not isinstance(
      top.target, targets.SpecDecode):
    raise ValueError("lenient intermediate levels need an exact top level "
                     "(method=spec_decode): the top must correct their "
                     "leniency for the output to stay the target's")
  return StackShape(buffers=stack.buffers, lenient=tuple(rules)), tuple(knobs)


def check(strategy: Strategy, models: Sequence, params: Sequence):
  """(models, params) as tuples; ValueError for a strategy or models that
  do not fit (before anything is padded or compiled)."""
  method, structure = strategy.method, strategy.structure
  if isinstance(structure, Stack):
    if not isinstance(method, methods_lib.Speculative):
      raise ValueError(f"the top level verifies with a speculative method "
                       f"(make_method('spec_decode'), a lossy or cascade "
                       f"rule), got {type(method).__name__}")
    models, params, _ = check_levels(list(zip(models, params)),
                                     structure.buffers)
    inputs_lib.check_method(method, strategy.sampling)
    stack_shape(structure, method)
    return models, params
  inputs_lib.check_method(method, strategy.sampling)
  if len(models) != 2 or len(params) != 2:
    raise ValueError(f"a chain or a tree decodes with (drafter, verifier) "
                     f"and their params; got {len(models)} models and "
                     f"{len(params)} parameter trees (a stack of more "
                     f"levels needs decoding.Stack)")
  inputs_lib.check_models(method, models[0], models[1])
  inputs_lib.check_params(method, models[0], models[1], params[0], params[1])
  return tuple(models), tuple(params)


def loop_config(strategy: Strategy, vocab_size: int, **fields) -> LoopConfig:
  """The static LoopConfig of a strategy (a checked TreeConfig for trees).

  Args:
    strategy: the strategy.
    vocab_size: the models' vocabulary size.
    **fields: the other LoopConfig fields (max_new, eos_id, pad_id, trace).
  """
  fields.setdefault("sampling", inputs_lib.sampling_static(strategy.sampling))
  structure = strategy.structure
  if isinstance(structure, Tree):
    return tree_loop.make_config(structure, strategy.method, vocab_size,
                                 **fields)
  if isinstance(structure, Chain):
    return LoopConfig(topology=structure.topology, **fields)
  return LoopConfig(topology=None, **fields)


def with_structure(batch: Batch, strategy: Strategy,
                   cfg: LoopConfig) -> Batch:
  """``batch`` with its ``structure`` data (tree arrays, stack knobs)."""
  rows = batch.prompt.shape[0]
  structure = strategy.structure
  if isinstance(structure, Tree):
    return batch.replace(structure=TreeArrays.of(cfg.topology, rows))
  if isinstance(structure, Stack):
    _, knobs = stack_shape(structure, strategy.method)
    return batch.replace(structure=StackKnobs.of(knobs, rows))
  return batch


def build_program(strategy: Strategy, models: tuple,
                  cfg: LoopConfig) -> LoopProgram:
  """The decode loop of ``strategy`` (the one dispatch on its structure)."""
  if isinstance(strategy.structure, Stack):
    shape, _ = stack_shape(strategy.structure, strategy.method)
    return hierarchy_program(models, cfg, shape,
                             split(strategy.method.target)[0])
  if isinstance(strategy.structure, Tree):
    rule = strategy.method.rule()
    if tree_loop.runs_as_chain(cfg):  # same tokens, the faster loop
      return speculative.chain_program(models, tree_loop.as_chain(cfg), rule)
    return tree_loop.tree_program(models, cfg, rule)
  return strategy.method.program(models, cfg)


@dataclasses.dataclass(frozen=True)
class Prepared:
  """A checked, padded request.

  Attributes:
    batch: the Batch (device arrays; padded with inert rows for a mesh).
    rows: the number of real rows.
    max_new: the static output buffer size (>= every row's budget).
    width: the padded prompt width.
  """

  batch: Batch
  rows: int
  max_new: int
  width: int


def prepare(strategy: Strategy, verifier, *, prompts=None, inputs=None,
            max_new_tokens=32, seeds=0, request_ids=None, pad_to=None,
            mesh=None) -> Prepared:
  """The ONE request prep of every entry point (``inputs.prepare_batch``)."""
  batch, rows, max_new, width = inputs_lib.prepare_batch(
      strategy.method, verifier, strategy.sampling, prompts=prompts,
      inputs=inputs, max_new_tokens=max_new_tokens, seeds=seeds,
      request_ids=request_ids, pad_to=pad_to, mesh=mesh)
  return Prepared(batch, rows, max_new, width)
