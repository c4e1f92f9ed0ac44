"""One memory budget: sizes are checked before anything allocates.

Every decode path asks the same two questions, here and only here:

* :func:`capacity`: how many KV-cache slots a row needs (prompt + new tokens
  + the draft block + slack; the loops allocate exactly this many);
* :func:`check`: do ``need`` bytes fit in what this process may still use
  (:func:`available`: the device's free memory, or on CPU the host's
  available memory, capped by the address-space limit ``ulimit -v``)? If
  not, a ``ValueError`` names the knob to lower and a size that fits.

What ``need`` counts is the caller's: ``specdec_jax decode`` checks the
parameters and KV caches from the configs before any weight loads;
``decoding.generate`` (and the hierarchy) call :func:`check_memory`: the
loop state, sized with ``jax.eval_shape`` of the program's init (nothing is
allocated), times :data:`XLA_FACTOR`; :func:`check_capacity` bounds the
cache slots by ``max_cache_length`` and int32 positions.

Measured (CPU, tiny Gemma pair, spec_decode, gamma 5, max_new_tokens 1e5):
the loop state is 49.2 MiB and XLA's compiled program needs 159.1 MiB of
temporaries on top of its 0.5 MiB of arguments and outputs (the while loop
keeps the state it carries and the one it builds, plus the model's
activations and cache-update copies), 3.2x the state. :data:`XLA_FACTOR`
rounds that up to 4 (the issue saw ~4x at 2e7 tokens).
"""

from __future__ import annotations

import os
import resource

import jax
import numpy as np

from specdec_jax import program_cache
from specdec_jax.decoding import transfer

GIB = 2**30
MAX_POSITIONS = 2**31 - 1  # positions and cache slots are int32

XLA_FACTOR = 4
"""Peak bytes of a compiled decode / bytes of its loop state (see above)."""


def capacity(prompt_width: int, max_new: int, block: int,
             chunk: int = 0) -> int:
  """Cache slots of a row: prompt + new tokens + block + 2 (+ a chunk).

  Args:
    prompt_width: P, the padded prompt width (1 for an encoder-decoder's
      decoder start).
    max_new: the largest per-row budget of the call.
    block: the tokens verified per step (gamma, or a tree's node count).
    chunk: extra slots some loops write past the block (a tree's catch-up
      token, a cascade's chunk).

  Returns:
    The slots every cache of the call has. ``dynamic_update_slice`` silently
    shifts a write that would overrun, so the slack is never optional.
  """
  return prompt_width + max_new + block + 2 + chunk


def _proc_bytes(file: str, key: str) -> int | None:
  """A ``key: N kB`` line of a /proc file, in bytes (None if absent)."""
  try:
    with open(file) as f:
      for line in f:
        if line.startswith(key + ":"):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return None


def _vm_size() -> int:
  """The address space this process maps (what ``ulimit -v`` limits)."""
  return _proc_bytes("/proc/self/status", "VmSize") or 0


def _host_available() -> int | None:
  have = _proc_bytes("/proc/meminfo", "MemAvailable")
  if have is not None:
    return have
  try:
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
  except (ValueError, OSError, AttributeError):
    return None


def available() -> tuple[int | None, str]:
  """(bytes this process may still allocate or None if unknown, what).

  An accelerator: its ``bytes_limit`` minus ``bytes_in_use``. The CPU: the
  host's available memory, capped by the headroom under ``ulimit -v``
  (RLIMIT_AS minus the address space already mapped).
  """
  dev = jax.devices()[0]
  try:
    stats = dev.memory_stats()
  except Exception:  # pylint: disable=broad-except  (not every backend has it)
    stats = None
  if stats and stats.get("bytes_limit"):
    return (int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0)),
            f"{dev.platform.upper()} memory")
  have = _host_available()
  soft, _ = resource.getrlimit(resource.RLIMIT_AS)
  if soft != resource.RLIM_INFINITY:
    room = max(0, soft - _vm_size())
    have = room if have is None else min(have, room)
  return have, "host memory"


def check(need: int, subject: str, for_what: str, fix: str,
          have: tuple[int | None, str] | None = None) -> None:
  """Raises ValueError when ``need`` bytes do not fit.

  Args:
    need: bytes the work will allocate at its peak.
    subject: who needs it, e.g. ``'max_new_tokens=64 with batch 8'``.
    for_what: what the bytes are, e.g. ``'the parameters and KV caches'``.
    fix: what to do, naming the knob (and a size that fits, when known).
    have: (bytes, what) to compare with (default :func:`available`).
  """
  have_bytes, what = have or available()
  if have_bytes is not None and need > have_bytes:
    raise ValueError(f"{subject} needs {need / GIB:.1f} GiB for {for_what} "
                     f"but the {what} is {have_bytes / GIB:.1f} GiB; {fix}")


# (program key, argument shapes) -> bytes of the loop state.
_STATE_BYTES: dict[tuple, int] = {}


def _state_bytes(program, args) -> int:
  sig = (program.key, *transfer.signature(args))
  if sig not in _STATE_BYTES:
    def compute():
      state = jax.eval_shape(program.init, args)
      return sum(int(np.prod(x.shape)) * x.dtype.itemsize
                 for x in jax.tree.leaves(state))
    key = program_cache.stable_repr(sig)
    _STATE_BYTES[sig] = (compute() if key is None else
                         program_cache.memo("state_bytes", key, compute))
  return _STATE_BYTES[sig]


def check_memory(program, args, mesh=None) -> None:
  """Raises ValueError when the decode cannot fit in memory.

  The loop state (KV caches of every level, token buffers) is sized with
  ``jax.eval_shape`` of the program's init, before anything is allocated;
  the compiled program needs ``XLA_FACTOR`` times that at its peak.
  So a budget beyond the memory is a clear error naming a max_new_tokens
  that fits, never an allocation crash.
  """
  state = _state_bytes(program, args)
  need = state * XLA_FACTOR
  have, what = available()
  if have is None:
    return
  devices = 1 if mesh is None else mesh.devices.size
  have *= devices
  if need > have:
    b, p = args[1].prompt.shape
    max_new = int(args[1].req.max_new_tokens.max())
    fit = int(max_new * have / need * 0.9)
    check(
        need, f"max_new_tokens={max_new} with batch {b} (prompt width {p})",
        f"its KV caches, token buffers and XLA's working copies "
        f"({XLA_FACTOR} x the {state / GIB:.2f} GiB loop "
        f"state)",
        f"lower max_new_tokens to {fit} or fewer" if fit >= 1 else
        "lower the batch or the prompt length", (have, what))


def check_capacity(prompt_width: int, max_new: int, cfg, is_tree: bool,
                   max_cache_length: int | None) -> None:
  """ValueError when a request needs more cache slots than allowed.

  Args:
    prompt_width: P, the padded prompt width.
    max_new: the longest row's budget.
    cfg: the loop config (its topology sizes the draft block).
    is_tree: tree verification (one more slot of slack per block).
    max_cache_length: the caller's bound on cache slots, or None.
  """
  need = capacity(prompt_width, max_new, cfg.topology.num_nodes,
                  chunk=int(is_tree))
  if max_cache_length is not None and need > max_cache_length:
    block = (f"the tree's {cfg.topology.num_nodes} nodes + 3" if is_tree
             else "gamma + 2")
    raise ValueError(
        f"prompt ({prompt_width} padded) + max_new_tokens ({max_new}) + "
        f"{block} = {need} cache slots exceed max_cache_length "
        f"({max_cache_length}); shorten the prompt, max_new_tokens or the "
        f"draft block")
  if need >= MAX_POSITIONS:
    raise ValueError(f"prompt + max_new_tokens needs {need} cache slots; "
                     f"positions are int32, ask for fewer tokens")


__all__ = ["GIB", "MAX_POSITIONS", "XLA_FACTOR", "available", "capacity",
           "check", "check_capacity", "check_memory"]
