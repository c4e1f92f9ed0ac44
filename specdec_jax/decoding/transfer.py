"""Host <-> device transfers of a decode call.

A call's inputs go to the device in one ``jax.device_put``, its outputs
come back as plain copies, and parameters that would be copied again by
every call (numpy leaves) are named in a warning.
"""

from __future__ import annotations

import warnings

import jax
import numpy as np


def to_device(tree):
  """``tree`` with its host (numpy) leaves on the device, in ONE
  ``jax.device_put`` (each put is a dispatch, ~60 us on CPU; and
  ``jnp.asarray`` would compile a copy program per shape, ~10-50 ms on a
  warm CLI run). JAX arrays (and tracers: the t5x adapter builds its batch
  inside jit) stay as they are."""
  leaves, treedef = jax.tree.flatten(tree)
  host = [i for i, x in enumerate(leaves) if isinstance(x, np.ndarray)]
  for i, x in zip(host, jax.device_put([leaves[i] for i in host])):
    leaves[i] = x
  return jax.tree.unflatten(treedef, leaves)


def signature(tree) -> tuple:
  """(treedef, abstract value of each leaf): what a jitted call of
  ``tree`` compiles for, hashable (the per-call memos key on it)."""
  leaves, treedef = jax.tree.flatten(tree)
  return treedef, tuple(map(jax.typeof, leaves))


def gather(x):
  """A (possibly multi-host sharded) array as one host numpy array."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    return multihost_utils.process_allgather(x, tiled=True)
  return np.asarray(x)  # one copy; jax.device_get costs ~10x the dispatch


def warn_host_params(role: str, params) -> None:
  """Warns (once per message) when ``params`` hold numpy arrays: a jitted
  call copies host leaves to the device on EVERY call (the default T5
  verifier's 42 MB: a 32-token call 54 -> 47 ms on a 2-core CPU once they
  are device arrays, benchmarks/results/device_params_ab.md)."""
  host = [x for x in jax.tree.leaves(params) if isinstance(x, np.ndarray)]
  if host:
    mb = sum(x.nbytes for x in host) / 2**20
    warnings.warn(
        f"the {role}'s params hold {len(host)} numpy arrays ({mb:.0f} MiB): "
        f"every decode call copies them to the device again; put them there "
        f"once, params = jax.device_put(params) (with a mesh: "
        f"jax.device_put(params, sharding.param_shardings(params, mesh)))",
        stacklevel=4)


__all__ = ["gather", "signature", "to_device", "warn_host_params"]
