"""Machinery shared by the Flax model families (T5, Gemma).

:class:`FlaxDecodeModel` implements the parts of the decode interface that do
not depend on the architecture: parameter init / shapes / checks / logical
axes, ``init_cache``, the argument checks of ``step``, and early exit. A
family subclass supplies its Flax module and a few hooks.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
from typing import Any, ClassVar, Mapping

import flax
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import program_cache
from specdec_jax.models import cache as cache_lib
from specdec_jax.models import masks as masks_lib
from specdec_jax.models.cache import KVCache
from specdec_jax.models.interface import Encoded, check_tokens
from specdec_jax.models.layers import box_names, dtype_of, unbox
from specdec_jax.models.params import check_params, shape_signature

# (id(model), params shape signature) -> the model whose check passed (kept
# so the id cannot be reused while the entry lives). A decode call checks
# its params every call; a tree of hundreds of leaves costs ~1 ms to walk.
_CHECKED: dict[tuple, Any] = {}
_CHECKED_MAX = 256


@functools.lru_cache(maxsize=64)
def _boxed_shapes(model: "FlaxDecodeModel") -> dict:
  """Abstract init of the full (base) model, partitioning boxes kept.

  Memoised per (hashable) model: tracing a 27B init takes seconds.
  """
  module = model.module()
  return jax.eval_shape(
      lambda rng: module.init(rng, *model.dummy_init_args(),
                              method="init_all")["params"],
      jax.random.PRNGKey(0))


@dataclasses.dataclass(frozen=True)
class FlaxDecodeModel(abc.ABC):
  """Common machinery of the Flax model families.

  Attributes:
    config: the family's frozen config dataclass.
    exit_layer: run only the first ``exit_layer`` decoder layers, then the
      final norm and the LM head (see :func:`early_exit`); None runs all.
      The params tree is always the full one.
    masks_cached_slots: ``step`` accepts a mask over the last M cached slots
      (``models/masks.py``), so tree drafting feeds each level once.
  """

  config: Any
  exit_layer: int | None = None

  is_encoder_decoder: ClassVar[bool] = False
  masks_cached_slots: ClassVar[bool] = True

  def __post_init__(self):
    n = self.num_decoder_layers
    if self.exit_layer is not None and not 1 <= self.exit_layer <= n:
      raise ValueError(f"early exit at layer {self.exit_layer} but the model "
                       f"has {n} decoder layers; use 1..{n}")

  # ---- family hooks -------------------------------------------------------

  @abc.abstractmethod
  def module(self):
    """The Flax (Linen) module, running ``self.depth`` decoder layers."""

  @abc.abstractmethod
  def dummy_init_args(self) -> tuple:
    """Arguments of the module's ``init_all`` method used for ``init``."""

  @property
  @abc.abstractmethod
  def num_decoder_layers(self) -> int:
    """Decoder layers of the config (the params tree holds all of them)."""

  @abc.abstractmethod
  def kv_shape(self) -> tuple[int, int]:
    """(kv_heads, head_dim) of the self-attention cache."""

  @classmethod
  @abc.abstractmethod
  def axes_examples(cls) -> tuple["FlaxDecodeModel", ...]:
    """Small models that together create every kind of parameter of the
    family; their declared logical axes label any size (``models/axes.py``)."""

  # ---- attributes of the decode interface --------------------------------

  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size

  @property
  def eos_id(self) -> int:
    return self.config.eos_id

  @property
  def depth(self) -> int:
    """Decoder layers this model runs (``exit_layer`` or all)."""
    return self.exit_layer or self.num_decoder_layers

  def base(self) -> "FlaxDecodeModel":
    """The same model without early exit (whose params this one reads)."""
    return dataclasses.replace(self, exit_layer=None)

  # ---- parameters ---------------------------------------------------------

  def init_params(self, rng: jax.Array) -> dict:
    """Random parameters of the full model, plain arrays in ``param_dtype``."""
    base = self.base()
    variables = base.module().init(rng, *base.dummy_init_args(),
                                   method="init_all")
    return flax.core.unfreeze(unbox(variables["params"]))

  def param_shapes(self) -> dict:
    """ShapeDtypeStruct tree of the (full) parameters, nothing allocated.

    Read from ``program_cache`` when it is on and a run already traced
    this config (a warm CLI run skips tracing the model's init).
    """
    key = program_cache.stable_repr(self.base())
    if key is None or program_cache.directory() is None:
      return self.param_shapes_traced()
    flat = program_cache.memo("param_shapes", key, lambda: [
        ["/".join(p), list(x.shape), str(x.dtype)] for p, x in
        flax.traverse_util.flatten_dict(self.param_shapes_traced()).items()])
    return flax.traverse_util.unflatten_dict(
        {tuple(p.split("/")): jax.ShapeDtypeStruct(tuple(s), jnp.dtype(d))
         for p, s, d in flat})

  def param_shapes_traced(self) -> dict:
    """:meth:`param_shapes` traced from the model's init (no store)."""
    return flax.core.unfreeze(unbox(_boxed_shapes(self.base())))  # fresh

  def param_axes(self) -> dict:
    """Logical axis names of every parameter, as declared by the layers.

    Returns:
      The params tree structure with a tuple of names per leaf, e.g.
      ``{'final_norm': {'scale': ('embed',)}, ...}``.
    """
    return flax.core.unfreeze(box_names(_boxed_shapes(self.base())))

  def num_params(self) -> int:
    """Total number of parameters (computed with ``jax.eval_shape``)."""
    leaves = jax.tree.leaves(self.param_shapes())
    return int(sum(int(np.prod(x.shape)) for x in leaves))

  def check_params(self, params: Mapping[str, Any]) -> None:
    """Raises ValueError unless ``params`` matches the full architecture.

    A tree of the same structure and leaf shapes as one that passed for
    this model object passes at once (the check reads nothing else)."""
    sig = shape_signature(params) if isinstance(params, Mapping) else None
    key = None if sig is None else (id(self), sig)
    if key is not None and _CHECKED.get(key) is self:
      return
    check_params(params, self.param_shapes(),
                 what=f"{type(self).__name__} params")
    if key is not None:
      if len(_CHECKED) >= _CHECKED_MAX:
        _CHECKED.clear()
      _CHECKED[key] = self

  def dtype(self) -> jnp.dtype:
    return dtype_of(self.config.dtype)

  def _apply(self, params, *args, method: str):
    return self.module().apply({"params": params}, *args, method=method)

  # ---- decode interface ---------------------------------------------------

  def init_cache(self, batch: int, max_length: int,
                 encoded: Encoded | None = None, dtype=None) -> KVCache:
    """Empty cache (all lengths 0) of ``self.depth`` layers.

    Args:
      batch: rows.
      max_length: positions per row (prompt + new tokens + gamma + 1 slack).
      encoded: encoder-decoder models: ``encode(params, inputs)`` of these
        rows (required; its first ``depth`` cross K/V are kept). Decoder-only
        models: must be None.
      dtype: cache dtype, default the compute dtype.
    """
    name = type(self).__name__
    cross = cross_mask = None
    if self.is_encoder_decoder:
      if encoded is None:
        raise ValueError(f"{name} is an encoder-decoder model: pass encoded="
                         f"model.encode(params, inputs) to init_cache")
      if encoded.mask.shape[0] != batch:
        raise ValueError(f"encoded batch {encoded.mask.shape[0]} != cache "
                         f"batch {batch}")
      if len(encoded.cross) < self.depth:
        raise ValueError(f"encoded holds cross K/V of {len(encoded.cross)} "
                         f"layers, this model runs {self.depth}")
      cross, cross_mask = tuple(encoded.cross[:self.depth]), encoded.mask
    elif encoded is not None:
      raise ValueError(f"{name} is decoder-only: init_cache takes no encoded=")
    layers = cache_lib.init_layers(batch, max_length, self.depth,
                                   *self.kv_shape(), dtype or self.dtype())
    return KVCache(lengths=jnp.zeros((batch,), jnp.int32), layers=layers,
                   cross=cross, cross_mask=cross_mask)

  def step(self, params, tokens: jax.Array, cache: KVCache, *,
           positions: jax.Array | None = None, mask: jax.Array | None = None,
           logits_at: jax.Array | None = None):
    """Block step: writes K tokens into the cache and returns their logits.

    Args:
      params: parameter tree (the full model's).
      tokens: [B, K] int32 block, written at slots ``[lengths, lengths+K)``.
      cache: the KVCache; every length advances by K.
      positions: optional [B, K] int32 absolute positions; default
        ``lengths[:, None] + arange(K)``. [B, M + K] with a mask over M
        cached slots (their key positions first).
      mask: optional [B, K, K] bool in-block mask (``mask[b, i, j]``: token
        i may attend to token j); default causal. The cached prefix is
        always visible (see ``models/masks.py`` and ``interface.py``).
        [B, K, M + K] also re-describes the last M cached slots.
      logits_at: optional [B] int32 block index (only that position's
        logits are projected) or [B, P] int32 indices (P positions).

    Returns:
      (logits [B, K, V] float32, or [B, 1, V] / [B, P, V] with
      ``logits_at``; cache).
    """
    check_tokens(tokens, self.config.vocab_size)
    masks_lib.check_step_args(tokens, positions, mask, logits_at)
    cache_lib.check_capacity(cache.lengths, tokens.shape[1], cache.max_length)
    if len(cache.layers) != self.depth:
      raise ValueError(f"the cache holds {len(cache.layers)} layers, this "
                       f"model runs {self.depth}; build it with this model's "
                       f"init_cache")
    return self._apply(params, tokens, cache, positions, mask, logits_at,
                       method="decode")


def early_exit(model, k: int):
  """The model truncated after its first ``k`` decoder layers.

  It runs decoder layers ``0..k-1``, then the final norm and the (shared) LM
  head; T5 keeps the whole encoder. It reads the base model's params tree
  (no copied weights; the unused layers are not read), so a hierarchy can
  use the verifier's params at an early-exit level. Its cache holds k layers.

  Args:
    model: a T5Model or GemmaModel (possibly already early-exit).
    k: number of decoder layers to run, 1..num_decoder_layers.

  Returns:
    A frozen, hashable model of the same family.
  """
  if not isinstance(model, FlaxDecodeModel):
    raise ValueError(f"early_exit needs a T5Model or GemmaModel, got "
                     f"{type(model).__name__}")
  if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
    raise ValueError(f"early exit layer must be an int, got {k!r}")
  return dataclasses.replace(model, exit_layer=int(k))
