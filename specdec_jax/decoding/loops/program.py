"""Decode programs and the drivers that compile and run them.

Every decoding method returns a :class:`LoopProgram` (``Method.program``):
``init`` builds the loop state (encode, allocate and prefill caches),
``cond`` / ``body`` are the ``lax.while_loop`` functions and ``finish``
extracts the outputs. :func:`run_program` compiles a program once per key
and runs it:

* on one device: one ``jax.jit`` of ``finish(while_loop(cond, body,
  init(args)))``;
* with a mesh: ``init`` is jitted with explicit ``out_shardings`` (the state
  lands sharded: batch rows over 'data', heads over 'model', see
  ``specdec_jax.sharding``), then the loop is jitted with explicit
  ``in_shardings`` / ``out_shardings`` and the state (every KV cache
  included) DONATED, so the caches are updated in place.

``args`` is the pytree ``(params, batch)``: ``params`` holds one parameter
tree per level of the stack, ``batch`` every per-row array (prompts,
lengths, encoder inputs, request parameters, sampling and method knobs as
plain dicts). Everything that selects code (models, topology, rule classes
and their static fields) is in the program's hashable ``key``; nothing in
``args`` does, so a compiled executable is chosen by the key alone and new
prompts or knob values never recompile.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Hashable

import jax
from jax import lax

from specdec_jax.decoding.loops import exported
from specdec_jax.decoding.rules import sampling


@dataclasses.dataclass(frozen=True)
class LoopProgram:
  """A decode loop as four pure functions of ``args`` and the state.

  Attributes:
    key: hashable identity of the program (static configuration); programs
      with equal keys share compiled executables.
    init: args -> state.
    cond: (args, state) -> bool scalar.
    body: (args, state) -> state.
    finish: (args, state) -> LoopOutput.
  """

  key: Hashable
  init: Callable[[Any], Any] = dataclasses.field(compare=False)
  cond: Callable[[Any, Any], Any] = dataclasses.field(compare=False)
  body: Callable[[Any, Any], Any] = dataclasses.field(compare=False)
  finish: Callable[[Any, Any], Any] = dataclasses.field(compare=False)

  def __post_init__(self):
    # ``sampling.LEAN`` is read while tracing: a program built under the
    # reference paths is another program (else a before/after run in one
    # process would reuse the first setting's executable).
    if not sampling.LEAN:
      object.__setattr__(self, "key", ("reference", self.key))

  def run_loop(self, args, state):
    """The while loop alone (usable inside another program)."""
    return lax.while_loop(lambda s: self.cond(args, s),
                          lambda s: self.body(args, s), state)

  def __call__(self, args):
    """The whole program as one traceable function of ``args``."""
    return self.finish(args, self.run_loop(args, self.init(args)))


# (program key, None) -> jitted whole program (one device);
# (program key, args shardings, state shardings) -> (init, loop, finish).
_COMPILED: dict[tuple, Any] = {}


def clear_compiled() -> None:
  """Drops every compiled decode program, and JAX's own caches.

  Each compiled program keeps its machine code mapped in memory. A process
  that compiles hundreds of programs (sweeps over pairs, gammas and prompt
  widths) can exhaust the kernel's memory-map limit on CPU (LLVM "Cannot
  allocate memory", then a crash). Call this between independent phases;
  later calls compile again (or read JAX's persistent cache when enabled).
  """
  _COMPILED.clear()
  exported.clear()
  jax.clear_caches()


def compile_count(key: Hashable) -> int:
  """Executables compiled so far for the single-device program ``key``."""
  jitted = _COMPILED.get((key, None))
  return 0 if jitted is None else jitted._cache_size()  # pylint: disable=protected-access


def run_program(program: LoopProgram, args, mesh=None):
  """Runs ``program`` on ``args`` (on ``mesh`` when given)."""
  if mesh is None:
    out = exported.run(program, args)  # the program store, when enabled
    if out is not None:
      return out
    if (program.key, None) not in _COMPILED:
      _COMPILED[program.key, None] = jax.jit(program.__call__)
    return _COMPILED[program.key, None](args)
  return _run_sharded(program, args, mesh)


class _Frozen:
  """A pytree of shardings, hashable so compiled programs can be cached."""

  def __init__(self, tree):
    self.tree = tree
    leaves, treedef = jax.tree.flatten(tree)
    self._key = (treedef, tuple(leaves))

  def __hash__(self):
    return hash(self._key)

  def __eq__(self, other):
    return isinstance(other, _Frozen) and self._key == other._key


def _sharded_jits(program: LoopProgram, args_sh: _Frozen, state_sh: _Frozen):
  """(init, loop, finish) jitted with explicit shardings; loop donates."""
  init = jax.jit(program.init, in_shardings=(args_sh.tree,),
                 out_shardings=state_sh.tree)
  loop = jax.jit(program.run_loop, in_shardings=(args_sh.tree, state_sh.tree),
                 out_shardings=state_sh.tree, donate_argnums=(1,))
  return init, loop, jax.jit(program.finish)


def _run_sharded(program: LoopProgram, args, mesh):
  from specdec_jax import sharding  # pylint: disable=g-import-not-at-top
  args_sh = _Frozen(sharding.args_shardings(args, mesh))
  state_sh = _Frozen(sharding.state_shardings(
      jax.eval_shape(program.init, args), mesh, args[1].prompt.shape[0]))
  key = (program.key, args_sh, state_sh)
  if key not in _COMPILED:
    _COMPILED[key] = _sharded_jits(program, args_sh, state_sh)
  init, loop, finish = _COMPILED[key]
  args = jax.device_put(args, args_sh.tree)
  return finish(args, loop(args, init(args)))
