"""A per-user store of what a warm CLI run would otherwise recompute.

JAX's persistent compilation cache saves XLA's compilation, but a new
process still traces and lowers every program, and sizes structures with
``jax.eval_shape`` (each a trace of a model). Measured on the built-in T5
pair (``specdec_jax decode`` of one request, a quiet 2-core machine): of a
4.5 s warm run, 1.7 s traced and lowered the decode program and 1.4 s traced
parameter, cache and loop-state shapes for the memory checks. The CLI turns
this store on beside the compilation cache (``main.enable_compilation_cache``);
library calls leave it off (nothing is written unless :func:`enable` is
called).

What it keeps, under ``<dir>`` (``<compilation cache>/specdec_jax_programs``):

* ``<kind>-<hash>.json``: small JSON values (:func:`memo`,
  :func:`load_value` / :func:`save_value`), e.g. a model's parameter
  shapes, the bytes of a loop state, a tuned auto table
  (``decoding/planners/tune_store.py``);
* ``<kind>-<hash>.bin``: byte blobs (:func:`load_bytes` / :func:`save_bytes`),
  the compiled decode programs of ``decoding/loops/stored.py``.

Every entry is keyed by a hash of its caller's key (the program key, shapes,
a model's config...) together with :func:`fingerprint`: the JAX and jaxlib
versions, the backend and the host CPU's features, the JAX settings that
change traced programs, and a hash of specdec_jax's own source files. A new
JAX, another machine or an edited source file therefore never reuses an
entry. An unreadable or
corrupt entry is recomputed; a directory that cannot be written is ignored
(a warm run is only slower). Delete the directory to reclaim its space.
Like JAX's compilation cache it holds machine code: keep it where only you
can write.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
from typing import Any, Callable

_DIR: list[str | None] = [None]

# JAX settings that change what a traced program computes.
_CONFIG_NAMES = ("jax_enable_x64", "jax_default_matmul_precision",
                 "jax_default_prng_impl", "jax_threefry_partitionable",
                 "jax_numpy_dtype_promotion", "jax_numpy_rank_promotion",
                 "jax_enable_checks", "jax_debug_nans", "jax_disable_jit")


def enable(path: str | None) -> None:
  """Turns the store on at ``path`` (None or '' turns it off)."""
  _DIR[0] = path or None


def directory() -> str | None:
  """The store's directory, or None when it is off."""
  return _DIR[0]


@functools.lru_cache(maxsize=1)
def source_hash() -> str:
  """sha256 of every .py file of the specdec_jax package (path + bytes)."""
  root = os.path.dirname(os.path.abspath(__file__))
  digest = hashlib.sha256()
  for base, dirs, files in os.walk(root):
    dirs.sort()
    for name in sorted(files):
      if name.endswith(".py"):
        path = os.path.join(base, name)
        digest.update(os.path.relpath(path, root).encode() + b"\0")
        with open(path, "rb") as f:
          digest.update(f.read())
  return digest.hexdigest()


def fingerprint() -> str:
  """Versions, backend, JAX settings and source hash, as one string."""
  import jax  # pylint: disable=g-import-not-at-top
  import jaxlib  # pylint: disable=g-import-not-at-top
  dev = jax.devices()[0]
  settings = {n: str(getattr(jax.config, n, None)) for n in _CONFIG_NAMES}
  return json.dumps(dict(jax=jax.__version__, jaxlib=jaxlib.__version__,
                         platform=dev.platform, kind=dev.device_kind,
                         devices=jax.device_count(), host=_host_cpu(),
                         settings=settings, source=source_hash()),
                    sort_keys=True)


@functools.lru_cache(maxsize=1)
def _host_cpu() -> str:
  """The host's architecture and CPU feature flags (machine code compiled
  for one CPU may not run on another sharing the same home directory)."""
  flags = ""
  try:
    with open("/proc/cpuinfo") as f:
      flags = next((ln for ln in f if ln.startswith(("flags", "Features"))),
                   "")
  except OSError:
    pass
  return platform.machine() + ":" + hashlib.sha256(
      flags.encode()).hexdigest()[:16]


def entry_path(kind: str, key: str, ext: str) -> str | None:
  """The file of entry (kind, key), or None when the store is off."""
  if _DIR[0] is None:
    return None
  h = hashlib.sha256((fingerprint() + "\0" + key).encode()).hexdigest()
  return os.path.join(_DIR[0], f"{kind}-{h[:40]}.{ext}")


def _write(path: str, data: bytes) -> None:
  """Writes ``path`` atomically (a reader never sees half a file)."""
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
      f.write(data)
    os.replace(tmp, path)
  except OSError:
    pass  # a read-only store only makes later runs slower


def load_bytes(kind: str, key: str) -> bytes | None:
  """The blob stored for (kind, key), or None (store off, or no entry)."""
  path = entry_path(kind, key, "bin")
  if path is None:
    return None
  try:
    with open(path, "rb") as f:
      return f.read()
  except OSError:
    return None


def save_bytes(kind: str, key: str, data: bytes) -> None:
  """Stores ``data`` for (kind, key) (nothing when the store is off)."""
  path = entry_path(kind, key, "bin")
  if path is not None:
    _write(path, data)


def load_value(kind: str, key: str) -> Any:
  """The JSON value stored for (kind, key), or None (store off, no entry,
  or an unreadable one)."""
  path = entry_path(kind, key, "json")
  if path is None:
    return None
  try:
    with open(path) as f:
      return json.load(f)["value"]
  except (OSError, ValueError, KeyError, TypeError):
    return None


def save_value(kind: str, key: str, value: Any) -> None:
  """Stores a JSON-serializable ``value`` for (kind, key) (nothing when the
  store is off); a later :func:`load_value` or :func:`memo` reads it."""
  path = entry_path(kind, key, "json")
  if path is not None:
    _write(path, json.dumps({"key": key, "value": value}).encode())


def memo(kind: str, key: str, compute: Callable[[], Any]) -> Any:
  """``compute()``, read from the store when a run already computed it.

  Args:
    kind: a short name of what is stored (part of the file name).
    key: everything the value depends on, as a string (deterministic
      across processes: reprs of frozen configs and shapes, never ids).
    compute: returns a JSON-serializable value.

  Returns:
    The value (computed, then stored, when the store is off or misses).
  """
  path = entry_path(kind, key, "json")
  if path is not None:
    try:
      with open(path) as f:
        return json.load(f)["value"]
    except (OSError, ValueError, KeyError):
      pass
  value = compute()
  if path is not None:
    _write(path, json.dumps({"key": key, "value": value}).encode())
  return value


def stable_repr(obj: Any) -> str | None:
  """``repr(obj)`` if it is the same in every process, else None.

  A repr holding an object address (``<function f at 0x7f...>``) names
  something the store cannot key on.
  """
  text = repr(obj)
  return None if " at 0x" in text else text


__all__ = ["directory", "enable", "fingerprint", "load_bytes", "load_value",
           "memo", "save_bytes", "save_value", "source_hash", "stable_repr"]
