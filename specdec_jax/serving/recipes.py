"""What a served request decodes with: its speculation and its loop program.

A request names a speculation mode (``off``, ``chain[:G]``, ``tree[:K,D]``,
``hierarchy[:T0,T1,..]``), a method (a registry name with its knobs) and
sampling knobs. :func:`recipe_of` turns the static part of that into a
:class:`Recipe`: the decode program of ``decoding`` (the same
``LoopProgram`` that ``decoding.generate`` / ``generate_hierarchy`` run)
plus a function that builds a one-row ``Batch`` exactly as the offline
path does. Requests whose recipes share a program key share a slot pool.

    spec = parse_speculation("tree:2,3")   # Speculation('tree', k=2, depth=3)
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from specdec_jax import decoding
from specdec_jax.decoding import registry
from specdec_jax.decoding import request as request_lib
from specdec_jax.decoding.rules import sampling as sampling_lib
from specdec_jax.decoding.verify.topology import Topology


MODES = ("off", "chain", "tree", "hierarchy")
_SPEC_RE = re.compile(r"^(off|chain|tree|hierarchy|auto)(?::([0-9, ]+))?$")


@dataclasses.dataclass(frozen=True)
class Speculation:
  """How a request drafts (static: part of its slot pool's key).

  Attributes:
    mode: 'off' (target only), 'chain', 'tree' or 'hierarchy'.
    gamma: chain draft length (mode 'chain').
    kary: (children per node K, depth D) of a k-ary tree (mode 'tree').
    buffers: hierarchy buffers T_0..T_{L-2} (mode 'hierarchy'; one per
      level below the target).
  """

  mode: str = "chain"
  gamma: int = 4
  kary: tuple[int, int] = (2, 2)
  buffers: tuple[int, ...] = ()

  def __str__(self) -> str:
    if self.mode == "chain":
      return f"chain:{self.gamma}"
    if self.mode == "tree":
      return f"tree:{self.kary[0]},{self.kary[1]}"
    if self.mode == "hierarchy":
      return "hierarchy:" + ",".join(map(str, self.buffers))
    return "off"


def parse_speculation(text: str, *, default_gamma: int = 4,
                      depth: int = 2) -> Speculation:
  """'off' | 'chain[:G]' | 'tree[:K,D]' | 'hierarchy[:T0,..]' -> value.

  Args:
    text: the request's ``speculation`` field.
    default_gamma: G when ``chain`` has none (also the default T_0).
    depth: number of levels of the served stack (hierarchy buffers:
      depth - 1 of them).

  Raises:
    ValueError naming the field and the accepted forms.
  """
  forms = ("off, chain[:G], tree[:K,D] or hierarchy[:T0,T1,..] "
           "(e.g. 'chain:4', 'tree:2,3')")
  if not isinstance(text, str):
    raise ValueError(f"speculation must be a string ({forms}), got "
                     f"{type(text).__name__}")
  m = _SPEC_RE.match(text.strip().lower())
  if not m:
    raise ValueError(f"speculation {text!r} is not one of {forms}")
  mode, nums = m.group(1), m.group(2)
  if mode == "auto":
    raise ValueError("speculation 'auto' (planner-chosen strategy) is not "
                     "available in this server yet; pick one of " + forms)
  vals = [] if nums is None else [int(x) for x in nums.split(",") if
                                  x.strip()]
  if any(v < 1 for v in vals) or (nums is not None and not vals):
    raise ValueError(f"speculation {text!r}: numbers must be integers >= 1")
  if mode == "off":
    if vals:
      raise ValueError(f"speculation 'off' takes no numbers, got {text!r}")
    return Speculation("off")
  if mode == "chain":
    if len(vals) > 1:
      raise ValueError(f"speculation chain takes one number G, got {text!r}")
    g = vals[0] if vals else default_gamma
    if g > 16:
      raise ValueError(f"chain length {g} is above 16; ask for fewer drafts")
    return Speculation("chain", gamma=g)
  if mode == "tree":
    if vals and len(vals) != 2:
      raise ValueError(f"speculation tree takes K,D (children, depth), got "
                       f"{text!r}")
    k, d = vals if vals else (2, 2)
    if k ** d > 64 or k * d > 64:
      raise ValueError(f"tree {k},{d} has too many nodes (> 64 leaves); "
                       f"use a smaller K or D")
    return Speculation("tree", kary=(k, d))
  if depth < 3:
    raise ValueError("speculation 'hierarchy' needs a served stack of 3+ "
                     "models; this server has " + str(depth))
  bufs = tuple(vals) if vals else tuple(
      default_gamma * 2 ** i for i in range(depth - 1))
  if len(bufs) != depth - 1:
    raise ValueError(f"hierarchy needs {depth - 1} buffers (one per level "
                     f"below the target), got {len(bufs)} in {text!r}")
  if max(bufs) > 32:
    raise ValueError(f"hierarchy buffers {bufs} above 32; use smaller ones")
  return Speculation("hierarchy", buffers=bufs)


@dataclasses.dataclass(frozen=True)
class Recipe:
  """The decode program of a pool and how to build its rows.

  Attributes:
    key: the pool's identity (the program key plus the prompt geometry).
    program: the ``LoopProgram`` every slot of the pool runs.
    params: one parameter tree per model the program runs.
    method: the method object (its knobs go into the batch).
    strategy: the ``decoding.Strategy`` the pool runs.
    cfg: its static ``LoopConfig``.
    verifier: the target model (the one that shapes every row's batch).
  """

  key: tuple
  program: object = dataclasses.field(compare=False)
  params: tuple = dataclasses.field(compare=False)
  method: object = dataclasses.field(compare=False)
  strategy: object = dataclasses.field(compare=False)
  cfg: object = dataclasses.field(compare=False)
  verifier: object = dataclasses.field(compare=False)


def make_method(name: str, knobs: dict):
  """Registry method with knobs; ValueError naming unknown ones.

  The sequential cascade baselines (token_cascade, oracle_*, seq_cascade)
  are refused: only the loops whose rows advance independently (target /
  drafter only, speculative and cascade rules) are served.
  """
  served = sorted(k for k, e in registry.REGISTRY.items()
                  if e.kind != "sequential")
  if name not in registry.REGISTRY:
    raise ValueError(f"unknown method {name!r}; choose one of "
                     f"{', '.join(served)}")
  if registry.REGISTRY[name].kind == "sequential":
    raise ValueError(f"method {name!r} is a sequential cascade baseline, "
                     f"not served (its loop is not checked slot by slot); "
                     f"choose one of {', '.join(served)}")
  method = decoding.make_method(name, **knobs)
  method.validate()
  return method


def recipe_of(levels, spec: Speculation, method, strategy, *, max_new: int,
              eos_id, pad_id: int, width: tuple[int, int]) -> Recipe:
  """The recipe of a request's static choices.

  Args:
    levels: the served stack [(model, params)], cheapest first, target last.
    spec: the request's Speculation.
    method: its method object (for 'off': ignored, the target alone).
    strategy: its sampling strategy (only the static half matters).
    max_new: the slot length (output buffer of every slot).
    eos_id, pad_id: the stop and filler ids.
    width: (decoder prompt width, encoder input width) of every slot.
  """
  models = tuple(m for m, _ in levels)
  params = tuple(p for _, p in levels)
  if spec.mode == "hierarchy" and not isinstance(method,
                                                 decoding.Speculative):
    raise ValueError("speculation 'hierarchy' verifies with a speculative "
                     "method (spec_decode, lossy or a cascade rule)")
  return _strategy_recipe(models, params, spec, method, strategy,
                          max_new=max_new, eos_id=eos_id, pad_id=pad_id,
                          width=width)


def _strategy_recipe(models, params, spec, method, strategy, *, max_new,
                     eos_id, pad_id, width) -> Recipe:
  """``recipe_of`` on the strategy value of ``decoding`` (issue 38): the
  program and its rows come from ``decoding.request``, as ``decode`` runs
  them."""
  if spec.mode == "hierarchy":
    structure = decoding.Stack(buffers=spec.buffers)
  else:
    models, params = models[-2:], params[-2:]
    if len(models) == 1:
      models, params = models * 2, params * 2
    if spec.mode == "off":
      method, structure = decoding.TargetOnly(), decoding.Chain(1)
    elif spec.mode == "chain":
      structure = decoding.Chain(spec.gamma)
    else:
      structure = decoding.Tree(Topology.kary(*spec.kary))
  strat = decoding.Strategy(method, structure, strategy)
  cfg = request_lib.loop_config(strat, models[-1].vocab_size,
                                max_new=max_new, eos_id=eos_id,
                                pad_id=pad_id)
  program = request_lib.build_program(strat, tuple(models), cfg)
  return Recipe(key=(program.key, width), program=program,
                params=tuple(params), method=method, strategy=strat, cfg=cfg,
                verifier=models[-1])


def row_batch(recipe: Recipe, strategy, prompt: np.ndarray, plen: int,
              inputs: np.ndarray | None, seed: int, request_id: int,
              max_tokens: int, method=None):
  """The one-row Batch of a request, built as ``decoding.generate`` does.

  The pool's recipe is shared by every request of its strategy key, so the
  row's traced knobs (temperature, top-k/top-p, the method's alpha/beta)
  come from THIS request's sampling and method, never from the request that
  created the pool.

  Args:
    strategy: the request's sampling strategy (its knob values).
    method: the request's method object (its knob values); None for
      speculation 'off' (the pool's target-only method).
    prompt: [P] decoder prompt, padded to the pool's width.
    plen: its length.
    inputs: [S] encoder input padded to the pool's width, or None.
  """
  enc = inputs is not None
  strat = recipe.strategy.replace(sampling=strategy)
  if method is not None and not isinstance(recipe.method,
                                           decoding.TargetOnly):
    strat = strat.replace(method=method)
  prep = request_lib.prepare(
      strat, recipe.verifier,
      prompts=None if enc else [list(prompt[:plen])],
      inputs=[list(inputs)] if enc else None, max_new_tokens=[max_tokens],
      seeds=[seed], request_ids=[request_id],
      pad_to=(inputs if enc else prompt).shape[0])
  return request_lib.with_structure(prep.batch, strat, recipe.cfg)


def is_greedy(strategy) -> bool:
  return sampling_lib.is_greedy(strategy)
