"""Decode programs serialized with ``jax.export``, so a warm run skips tracing.

With the program store on (``specdec_jax.program_cache.enable``; the CLI
does it beside JAX's persistent compilation cache), :func:`run` looks up the
single-device program by a hash of

* ``repr(program.key)`` (models with their configs, the loop config, the
  rule classes and static fields: everything that selects code),
* the argument tree and every leaf's shape, dtype and weak type,
* ``program_cache.fingerprint()`` (JAX / jaxlib versions, backend, host
  CPU, JAX settings, a hash of specdec_jax's source);

(the program key is what ``run_program``'s in-memory cache already trusts
to select code: nothing in ``args`` does, see ``program.py``);

on a miss it traces and lowers the program once with ``jax.export``, stores
the serialized StableHLO, and runs it; on a hit it deserializes it and runs
it without tracing or lowering the Python program (XLA's compilation itself
comes from the persistent compilation cache). Cold and warm runs both call
the exported program, so their tokens are the same bits.

Measured (a warm ``specdec_jax decode`` of one request on the built-in T5
pair, 2-core machine at load ~10): tracing the program (1.3-2.5 s) is gone;
lowering the exported call (0.45-0.6 s) and loading the executable from the
compilation cache (0.9-1.7 s) remain. Storing the compiled executable instead
(``jax.experimental.serialize_executable``) would skip the lowering too, but
an executable that XLA loaded from the compilation cache serializes into a
blob that fails at run time ("Function ... not found"), so it is not used.

A program whose key has no stable repr, or that ``jax.export`` refuses,
runs as a plain ``jax.jit`` (the caller falls back when :func:`run` returns
None). The output is rebuilt from a JSON description of its tree
(:func:`describe`): containers and specdec_jax dataclasses only.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from typing import Any

import jax

from specdec_jax import program_cache
from specdec_jax.decoding import transfer

# (store key) -> jitted call of the deserialized program (this process).
_CALLS: dict[str, Any] = {}
# (program key, treedef, avals) -> store_key's text.
_KEYS: dict[tuple, str | None] = {}
KIND = "program"


class Unsupported(Exception):
  """The program's output cannot be described (it runs as a plain jit)."""


def describe(tree) -> Any:
  """A JSON description of ``tree``'s structure (leaves are ``'*'``).

  Raises:
    Unsupported: a node that is not None, a tuple / list / str-keyed dict or
      a dataclass of specdec_jax.
  """
  if tree is None:
    return None
  if isinstance(tree, (tuple, list)):
    return {type(tree).__name__: [describe(x) for x in tree]}
  if isinstance(tree, dict):
    if not all(isinstance(k, str) for k in tree):
      raise Unsupported("dict with non-string keys")
    return {"dict": {k: describe(v) for k, v in sorted(tree.items())}}
  cls = type(tree)
  if dataclasses.is_dataclass(tree):
    if not cls.__module__.startswith("specdec_jax."):
      raise Unsupported(f"{cls.__module__}.{cls.__qualname__}")
    return {"cls": f"{cls.__module__}:{cls.__qualname__}",
            "fields": {f.name: describe(getattr(tree, f.name))
                       for f in dataclasses.fields(tree)}}
  if hasattr(tree, "shape") and hasattr(tree, "dtype"):
    return "*"
  raise Unsupported(type(tree).__name__)


def _class(name: str):
  module, _, qualname = name.partition(":")
  if not module.startswith("specdec_jax."):
    raise Unsupported(name)
  obj = importlib.import_module(module)
  for part in qualname.split("."):
    obj = getattr(obj, part)
  return obj


def rebuild(desc, leaves) -> Any:
  """The tree described by ``desc`` with ``leaves`` (an iterator) in it."""
  if desc is None:
    return None
  if desc == "*":
    return next(leaves)
  if "tuple" in desc:
    return tuple(rebuild(d, leaves) for d in desc["tuple"])
  if "list" in desc:
    return [rebuild(d, leaves) for d in desc["list"]]
  if "dict" in desc:
    return {k: rebuild(v, leaves) for k, v in desc["dict"].items()}
  fields = {k: rebuild(v, leaves) for k, v in desc["fields"].items()}
  return _class(desc["cls"])(**fields)


def _spec(x) -> jax.ShapeDtypeStruct:
  aval = jax.typeof(x)
  return jax.ShapeDtypeStruct(aval.shape, aval.dtype,
                              weak_type=aval.weak_type)


def store_key(program, args) -> str | None:
  """The program's key in the store (None: it has no stable repr).

  Memoised per (program key, argument structure, abstract values): the
  text (~12 kB for a T5 pair) costs ~1.7 ms to build, on every call."""
  treedef, avals = transfer.signature(args)
  sig = (program.key, treedef, avals)
  if sig not in _KEYS:
    if len(_KEYS) >= 1024:
      _KEYS.clear()
    key = program_cache.stable_repr(program.key)
    _KEYS[sig] = None if key is None else json.dumps(
        [key, str(treedef), [(tuple(a.shape), str(a.dtype),
                              bool(a.weak_type)) for a in avals]])
  return _KEYS[sig]


def _export(program, args, key: str):
  """Traces, lowers and stores the program; returns (exported, desc)."""
  leaves, treedef = jax.tree.flatten(args)
  described = []

  def flat(*xs):
    out = program(jax.tree.unflatten(treedef, xs))
    described.append(describe(out))
    return tuple(jax.tree.leaves(out))

  exp = jax.export.export(jax.jit(flat))(*map(_spec, leaves))
  meta = json.dumps({"desc": described[0]}).encode()
  blob = exp.serialize()
  program_cache.save_bytes(KIND, key, len(meta).to_bytes(8, "little") +
                           meta + bytes(blob))
  return exp, described[0]


def _load(key: str):
  """(exported, desc) from the store, or None (absent or unreadable)."""
  data = program_cache.load_bytes(KIND, key)
  if data is None or len(data) < 8:
    return None
  n = int.from_bytes(data[:8], "little")
  try:
    desc = json.loads(data[8:8 + n])["desc"]
    return jax.export.deserialize(bytearray(data[8 + n:])), desc
  except Exception:  # pylint: disable=broad-except  (a corrupt entry)
    return None


def run(program, args):
  """Runs ``program`` on ``args`` through the store; None if it cannot.

  Returns None when the store is off, the key has no stable repr, or the
  program cannot be exported (the caller then runs a plain jit).
  """
  if program_cache.directory() is None:
    return None
  key = store_key(program, args)
  if key is None:
    return None
  if key not in _CALLS:
    found = _load(key)
    if found is None:
      try:
        found = _export(program, args, key)
      except Exception:  # pylint: disable=broad-except  (Unsupported, or
        return None      # what jax.export refuses: the plain jit runs it)
    exp, desc = found
    _CALLS[key] = (jax.jit(exp.call), desc)
  call, desc = _CALLS[key]
  out = call(*jax.tree.leaves(args))
  return rebuild(desc, iter(out))


def clear() -> None:
  """Forgets this process's deserialized programs (not the store)."""
  _CALLS.clear()


__all__ = ["clear", "describe", "rebuild", "run", "store_key"]
