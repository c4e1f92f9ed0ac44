"""The one decode interface every model family implements.

Decoding code (``specdec_jax.decoding``) never imports a model family; it only
calls the methods below. A model is a frozen, hashable dataclass holding its
config, so it can be closed over or passed as a static argument to ``jax.jit``.

    model.init_params(rng)                        -> params
    model.encode(params, inputs)                  -> Encoded  (encoder-decoder only)
    model.init_cache(batch, max_length, encoded=) -> KVCache (per-row lengths [batch])
    model.step(params, tokens[B, K], cache, logits_at=None)
                                                  -> (logits [B, K, V] float32, cache)
                                                     ([B, 1, V] at logits_at [B])
    model.forward(params, tokens, inputs=)        -> logits, no cache (reference path)

``step`` writes its K tokens at each row's own length and advances every length
by K; rolling back after a rejection is ``cache.with_lengths(new_lengths)``.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
from typing import Any, Mapping, Protocol

import flax
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specdec_jax.models.cache import KVCache

Params = Mapping[str, Any]  # nested dict of arrays, Flax 'params' collection


@struct.dataclass
class Encoded:
  """Output of an encoder, ready to be placed in a decoder cache.

  Attributes:
    cross: one LayerKV per decoder layer, [batch, src_length, heads, head_dim].
    mask: [batch, src_length] bool, True on real (non-pad) source tokens.
  """

  cross: tuple
  mask: jax.Array


class DecodeModel(Protocol):
  """Structural type of a model usable by the decoding code."""

  @property
  def vocab_size(self) -> int:
    ...

  @property
  def is_encoder_decoder(self) -> bool:
    ...

  def init_params(self, rng: jax.Array) -> Params:
    ...

  def encode(self, params: Params, inputs: jax.Array) -> Encoded:
    ...

  def init_cache(self, batch: int, max_length: int,
                 encoded: Encoded | None = None) -> KVCache:
    ...

  def step(self, params: Params, tokens: jax.Array, cache: KVCache,
           logits_at: jax.Array | None = None) -> tuple[jax.Array, KVCache]:
    ...


def check_tokens(tokens, vocab_size: int, what: str = "tokens") -> None:
  """Raises ValueError if concrete ``tokens`` contain ids outside the vocabulary.

  Traced values are not checked (the public decode API checks its inputs on
  the host before entering ``jit``).

  Args:
    tokens: integer array of any shape.
    vocab_size: number of ids the model embeds.
    what: name used in the error message.
  """
  if isinstance(tokens, jax.core.Tracer):
    return
  arr = np.asarray(tokens)
  if arr.size == 0:
    return
  if not np.issubdtype(arr.dtype, np.integer):
    raise ValueError(f"{what} must be integer token ids, got dtype {arr.dtype}")
  lo, hi = int(arr.min()), int(arr.max())
  if lo < 0 or hi >= vocab_size:
    bad = lo if lo < 0 else hi
    where = tuple(int(i) for i in np.argwhere(arr == bad)[0])
    raise ValueError(
        f"{what} contain id {bad} at index {where}, outside the model's "
        f"vocabulary [0, {vocab_size}); check the tokenizer matches the model")


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
  out = {}
  for key in sorted(tree):
    val = tree[key]
    path = f"{prefix}/{key}" if prefix else str(key)
    if isinstance(val, Mapping):
      out.update(_flatten(val, path))
    else:
      out[path] = val
  return out


def flatten_params(tree: Mapping[str, Any]) -> dict[str, Any]:
  """Nested dict -> {'a/b/c': leaf} with '/'-joined paths, sorted."""
  return _flatten(tree)


def unflatten_params(flat: Mapping[str, Any]) -> dict[str, Any]:
  """{'a/b/c': leaf} -> nested dict."""
  out: dict[str, Any] = {}
  for path, val in flat.items():
    node = out
    parts = path.split("/")
    for p in parts[:-1]:
      node = node.setdefault(p, {})
    node[parts[-1]] = val
  return out


def check_params(params: Mapping[str, Any], expected: Mapping[str, Any],
                 what: str = "params") -> None:
  """Compares a parameter tree against the expected shapes.

  Args:
    params: nested dict of arrays (or ShapeDtypeStructs).
    expected: nested dict of arrays/ShapeDtypeStructs with the right shapes.
    what: name used in error messages.

  Raises:
    ValueError naming the first missing, unexpected or wrong-shape leaf.
  """
  if not isinstance(params, Mapping):
    raise ValueError(f"{what} must be a nested dict of arrays, got "
                     f"{type(params).__name__}")
  got, want = flatten_params(params), flatten_params(expected)
  missing = [p for p in want if p not in got]
  if missing:
    raise ValueError(
        f"{what} is missing {len(missing)} leaf/leaves, first: '{missing[0]}' "
        f"(expected shape {tuple(want[missing[0]].shape)}); the checkpoint "
        f"or parameter tree does not match this architecture")
  extra = [p for p in got if p not in want]
  if extra:
    raise ValueError(
        f"{what} has {len(extra)} unexpected leaf/leaves, first: '{extra[0]}' "
        f"(shape {tuple(np.shape(got[extra[0]]))}); the checkpoint or "
        f"parameter tree does not match this architecture")
  for path, ref in want.items():
    shape = tuple(np.shape(got[path]))
    if shape != tuple(ref.shape):
      raise ValueError(
          f"{what} leaf '{path}' has shape {shape}, expected "
          f"{tuple(ref.shape)}; the checkpoint or preset does not match")


@functools.lru_cache(maxsize=64)
def _param_shapes(model: "FlaxDecodeModel") -> dict:
  """Memoised per (hashable) model: tracing a 27B init takes seconds."""
  return jax.eval_shape(model.init_params, jax.random.PRNGKey(0))


@dataclasses.dataclass(frozen=True)
class FlaxDecodeModel(abc.ABC):
  """Common machinery of the Flax model families (init, shapes, checks).

  Subclasses set ``config`` and implement ``module()``, ``_dummy_init_args()``
  and the decode interface methods.
  """

  config: Any

  @abc.abstractmethod
  def module(self):
    """The Flax (Linen) module of this architecture."""

  @abc.abstractmethod
  def _dummy_init_args(self) -> tuple:
    """Arguments of the module's ``init_all`` method used for ``init``."""

  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size

  def init_params(self, rng: jax.Array) -> dict:
    """Random parameters (the 'params' collection), in ``param_dtype``."""
    variables = self.module().init(
        rng, *self._dummy_init_args(), method="init_all")
    return flax.core.unfreeze(variables["params"])

  def param_shapes(self) -> dict:
    """ShapeDtypeStruct tree of the parameters, without allocating them."""
    return jax.tree.map(lambda x: x, _param_shapes(self))  # a fresh tree

  def num_params(self) -> int:
    """Total number of parameters (computed with ``jax.eval_shape``)."""
    leaves = jax.tree.leaves(self.param_shapes())
    return int(sum(int(np.prod(x.shape)) for x in leaves))

  def check_params(self, params: Mapping[str, Any]) -> None:
    """Raises ValueError unless ``params`` matches this architecture."""
    check_params(params, self.param_shapes(),
                 what=f"{type(self).__name__} params")

  def _apply(self, params, *args, method: str):
    return self.module().apply({"params": params}, *args, method=method)

  def dtype(self) -> jnp.dtype:
    from specdec_jax.models.layers import dtype_of  # pylint: disable=g-import-not-at-top
    return dtype_of(self.config.dtype)
