"""Decode programs and the drivers that compile and run them.

Every decoding method is a :class:`LoopProgram`: ``init`` builds the loop
state (encode, allocate and prefill caches), ``cond`` / ``body`` are the
``lax.while_loop`` functions and ``finish`` extracts the outputs. A driver
compiles a program once per static configuration and runs it:

* :func:`run_program` on one device: one ``jax.jit`` of
  ``finish(while_loop(cond, body, init(args)))``.
* with a mesh: ``init`` is jitted with explicit ``out_shardings`` (the state
  lands sharded: batch rows over 'data', heads over 'model', see
  ``specdec_jax.sharding``), then the loop is jitted with explicit
  ``in_shardings`` / ``out_shardings`` and the state (both KV caches
  included) DONATED, so the caches are updated in place.

``args`` is the pytree ``(q_params, p_params, batch)`` where ``batch`` holds
every per-row array (prompts, lengths, encoder inputs, request parameters,
sampling and method knobs); it is traced, so new prompts and knob values
never recompile.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Hashable

import jax
from jax import lax


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


_PROGRAMS: dict[Hashable, LoopProgram] = {}
# (program key, node classes) -> jitted whole program (see ``node_classes``).
_SINGLE_DEVICE: dict[tuple[Hashable, tuple[type, ...]], Callable] = {}


def cached_program(key: Hashable, build: Callable[[], LoopProgram]):
  """Returns the program for ``key``, building it on first use."""
  if key not in _PROGRAMS:
    _PROGRAMS[key] = build()
  return _PROGRAMS[key]


def _whole(program: LoopProgram):
  def run(args):
    state = program.init(args)
    state = lax.while_loop(lambda s: program.cond(args, s),
                           lambda s: program.body(args, s), state)
    return program.finish(args, state)
  return run


def node_classes(tree) -> tuple[type, ...]:
  """The classes of the dataclass nodes of ``tree``, in flatten order.

  Part of every compiled program's cache key. ``jax.jit`` keys its own cache
  on the argument's PyTreeDef, and for dataclass pytrees (``flax.struct``)
  PyTreeDef equality ignores the node class: ``TokenV2(alpha=a)`` and
  ``TokenV3(alpha=a)`` compare equal although their hashes differ. A lookup
  whose hash happens to collide then silently reuses the executable traced
  for the other class -- another method's program (seen in CI: TokenV3 ran
  TokenV2's rule). One jitted callable per class signature rules that out.

  Args:
    tree: any pytree (here ``(q_params, p_params, batch)``).

  Returns:
    A hashable tuple of classes; leaves and plain containers are skipped.
  """
  classes = []

  def visit(node):
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
      classes.append(type(node))
    return False

  jax.tree_util.tree_flatten(tree, is_leaf=visit)
  return tuple(classes)


def _single_device_jit(key, classes):
  if (key, classes) not in _SINGLE_DEVICE:
    _SINGLE_DEVICE[key, classes] = jax.jit(_whole(_PROGRAMS[key]))
  return _SINGLE_DEVICE[key, classes]


def clear_compiled() -> None:
  """Drops every compiled decode program, and JAX's own caches.

  Each compiled program keeps its machine code mapped in memory. A process
  that compiles hundreds of programs (sweeps over pairs, gammas and prompt
  widths) can exhaust the kernel's memory-map limit on CPU (LLVM "Cannot
  allocate memory", then a crash). Call this between independent phases;
  later calls compile again (or read JAX's persistent cache when enabled).
  """
  _SINGLE_DEVICE.clear()
  _sharded_jits.cache_clear()
  _PROGRAMS.clear()
  jax.clear_caches()


def compile_count(key: Hashable) -> int:
  """Executables compiled so far for the single-device program ``key``."""
  return sum(jitted._cache_size()  # pylint: disable=protected-access
             for (k, _), jitted in _SINGLE_DEVICE.items() if k == key)


def run_program(program: LoopProgram, args, mesh=None):
  """Runs ``program`` on ``args`` (on ``mesh`` when given)."""
  _PROGRAMS.setdefault(program.key, program)
  classes = node_classes(args)
  if mesh is None:
    return _single_device_jit(program.key, classes)(args)
  return _run_sharded(program, args, mesh, classes)


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


@functools.lru_cache(maxsize=None)
def _sharded_jits(key, classes, args_sh: _Frozen, state_sh: _Frozen):
  """(init, loop, finish) jitted with explicit shardings; loop donates."""
  del classes  # only keys the cache (see ``node_classes``)
  program = _PROGRAMS[key]
  # Fresh closures: jax also caches traces per wrapped function object, with
  # the same class-blind PyTreeDef equality.
  init = jax.jit(lambda args: program.init(args), in_shardings=(args_sh.tree,),
                 out_shardings=state_sh.tree)

  def loop(args, state):
    return lax.while_loop(lambda s: program.cond(args, s),
                          lambda s: program.body(args, s), state)

  run = jax.jit(loop, in_shardings=(args_sh.tree, state_sh.tree),
                out_shardings=state_sh.tree, donate_argnums=(1,))
  return init, run, jax.jit(lambda args, s: program.finish(args, s))


def _run_sharded(program: LoopProgram, args, mesh, classes):
  from specdec_jax import sharding  # pylint: disable=g-import-not-at-top
  args_sh = sharding.args_shardings(args, mesh)
  state_sh = sharding.state_shardings(jax.eval_shape(program.init, args),
                                      mesh)
  init, run, finish = _sharded_jits(program.key, classes, _Frozen(args_sh),
                                    _Frozen(state_sh))
  args = jax.device_put(args, args_sh)
  state = run(args, init(args))
  return finish(args, state)
