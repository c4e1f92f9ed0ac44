"""The one decode interface every model implements (:class:`DecodeModel`).

Decoding code (``specdec_jax.decoding``) never imports a model family; it only
uses the attributes and methods below. To plug in your own model, implement
them (any class; subclassing is not needed) and pass the model and its params
to ``decoding.generate``; :func:`check_decode_model` says what is missing.
The model object must be hashable and immutable (a frozen dataclass): it is a
static argument of ``jax.jit``. Params are any pytree.

Attributes:
    vocab_size: int, rows of the output distribution (logits' last axis).
    is_encoder_decoder: bool.
    eos_id: int id that ends a row, or None (never stop early).
    masks_cached_slots: optional bool, default False. True declares that
        ``step`` also takes the cached-slot form of ``positions`` / ``mask``
        below; tree drafting then feeds each tree level once instead of the
        whole block prefix per level (same logits, fewer tokens).

Methods (shapes: B rows, N tokens per block, T cache slots, V vocabulary):

    init_cache(batch, max_length, encoded=None) -> KVCache
        All lengths 0. ``encoded`` is required for an encoder-decoder model
        (the output of ``encode``) and must be None otherwise.
    encode(params, inputs [B, S] int32) -> Encoded      (encoder-decoder only)
        ``inputs`` are right-padded with the pad id.
    step(params, tokens [B, N] int32, cache, *, positions=None, mask=None,
         logits_at=None) -> (logits, cache)
        logits: [B, N, V] float32, or [B, 1, V] when ``logits_at`` [B] int32
        is given (only block position ``logits_at[b]`` is projected), or
        [B, P, V] when ``logits_at`` is [B, P] int32 (positions
        ``logits_at[b, :]``, in that order; the tree drafter asks for the
        nodes of one tree level). ``cache.select_positions`` does both.

What ``step`` must do:

* Write the N tokens' keys/values at slots ``[lengths[b], lengths[b] + N)``
  of each row (per-row ``cache.lengths`` [B] int32, rows are ragged) and
  return the cache with every length advanced by N. Writes overwrite; the
  decode loops size caches with slack, so a write never overruns.
* Entries at or past a row's length are garbage (left by rollbacks) and must
  be masked out using the lengths, never assumed zero.
* positions [B, N] int32 are the tokens' absolute positions (RoPE angle,
  relative-position bucket, sliding-window distance). None means
  ``lengths[:, None] + arange(N)``.
* mask [B, N, N] bool: ``mask[b, i, j]`` = block token i may attend to block
  token j. None means causal (j <= i). The cached prefix ``[0, lengths)`` is
  always visible to every block token (a sliding window still applies:
  allowed iff ``0 <= q_pos - k_pos < window``); the key position of prefix
  slot s is s, that of block slot ``lengths + j`` is ``positions[b, j]``;
  slots at or past ``lengths + N`` are never visible.
* Token trees: with parent pointers, ``positions = lengths + depth(node)``
  and ``mask[i, j] = j is an ancestor of i or j == i``; the logits of every
  node then equal an uncached forward of prefix + that node's path.
* Cached-slot form (only for a model with ``masks_cached_slots = True``):
  positions [B, M + N] and mask [B, N, M + N] also describe the last M
  cached slots ``[lengths - M, lengths)``: column j < M is that slot, with
  key position ``positions[b, j]``, visible to block token i iff
  ``mask[b, i, j]``; columns M.. are the block. Slots before
  ``lengths - M`` stay visible at their own positions; columns before slot
  0 are ignored. ``models/masks.step_masks`` implements it.
* With positions and mask both None, a step must cost what a plain causal
  block costs (the chain decoders call it that way).

What the decode loops feed:

* Prefill: a prompt of P tokens (right-padded to the batch's width, per-row
  ``prompt_len``) is written by ONE step over the whole padded block on an
  empty cache, with ``logits_at`` (the logits are not used), then rolled
  back with ``cache.with_lengths(prompt_len - 1)``: the LAST prompt token is
  held back and fed by the first decode step, which produces the first new
  token's distribution.
* Decode: blocks of 1 (drafter) or gamma + 1 (verifier) tokens per row.
* Catch-up blocks (a model that fell behind) use ``logits_at`` to project
  only the last real token of a right-padded block.
* Tree drafting feeds the tree's levels under the ancestor mask and asks,
  with ``logits_at`` [B, P], only for the logits of the newest level's nodes:
  one level per call in the cached-slot form, else the block prefix of every
  depth <= k at call k (the plain in-block mask).
* Rollback after a rejection: ``cache.with_lengths(new_lengths)``; tree
  acceptance: ``cache.commit(start, path, count)``. Models only need to
  keep ``KVCache`` semantics (lengths + per-layer K/V buffers).
"""

from __future__ import annotations

import inspect
from typing import Any, Protocol, runtime_checkable

import jax
import numpy as np
from flax import struct

from specdec_jax.models.cache import KVCache
from specdec_jax.models.params import (Params, check_params, flatten_params,
                                       unflatten_params)

__all__ = ["DecodeModel", "Encoded", "EncoderDecoderModel", "Params",
           "check_decode_model",
           "check_params", "check_tokens", "flatten_params",
           "unflatten_params"]


@struct.dataclass
class Encoded:
  """Output of an encoder, ready to be placed in a decoder cache.

  Attributes:
    cross: one LayerKV per decoder layer, [batch, src_length, heads, head_dim].
    mask: [batch, src_length] bool, True on real (non-pad) source tokens.
  """

  cross: tuple
  mask: jax.Array


@runtime_checkable
class DecodeModel(Protocol):
  """Structural type of a model usable by the decoding code.

  See the module docstring for the exact contract of each member.
  ``isinstance(model, DecodeModel)`` checks that the members exist;
  :func:`check_decode_model` also checks their types, ``step``'s keywords
  and, for an encoder-decoder model, ``encode`` (:class:`EncoderDecoderModel`).
  """

  vocab_size: int
  is_encoder_decoder: bool
  eos_id: int | None

  def init_cache(self, batch: int, max_length: int,
                 encoded: Encoded | None = None) -> KVCache:
    """Empty cache of ``batch`` rows x ``max_length`` slots, lengths 0."""
    ...

  def step(self, params: Any, tokens: jax.Array, cache: KVCache, *,
           positions: jax.Array | None = None, mask: jax.Array | None = None,
           logits_at: jax.Array | None = None) -> tuple[jax.Array, KVCache]:
    """tokens [B, N] -> (logits [B, N | 1 | P, V] float32, advanced cache)."""
    ...


@runtime_checkable
class EncoderDecoderModel(DecodeModel, Protocol):
  """A DecodeModel with ``is_encoder_decoder = True`` also has ``encode``."""

  def encode(self, params: Any, inputs: jax.Array) -> Encoded:
    """inputs [B, S] int32 (right-padded) -> Encoded for ``init_cache``."""
    ...


_STEP_KEYWORDS = ("positions", "mask", "logits_at")


def check_decode_model(model: Any, what: str = "model") -> None:
  """Raises ValueError unless ``model`` implements :class:`DecodeModel`.

  Args:
    model: the object to check.
    what: its role, used in the message ('drafter', 'verifier', ...).

  Raises:
    ValueError naming the first missing or malformed attribute or method.
  """
  name = f"{what} ({type(model).__name__})"
  hint = "see specdec_jax/models/interface.py for the decode interface"
  for attr in ("vocab_size", "is_encoder_decoder", "eos_id"):
    if not hasattr(model, attr):
      raise ValueError(f"{name} has no attribute {attr!r}; {hint}")
  vocab = model.vocab_size
  if isinstance(vocab, bool) or not isinstance(vocab, (int, np.integer)) \
      or vocab < 1:
    raise ValueError(f"{name}.vocab_size must be a positive int, got "
                     f"{vocab!r}")
  if not isinstance(model.is_encoder_decoder, (bool, np.bool_)):
    raise ValueError(f"{name}.is_encoder_decoder must be a bool, got "
                     f"{model.is_encoder_decoder!r}")
  cached = getattr(model, "masks_cached_slots", False)
  if not isinstance(cached, (bool, np.bool_)):
    raise ValueError(f"{name}.masks_cached_slots must be a bool (True only if "
                     f"step takes the cached-slot mask form), got {cached!r}")
  eos = model.eos_id
  if eos is not None and (isinstance(eos, bool)
                          or not isinstance(eos, (int, np.integer))):
    raise ValueError(f"{name}.eos_id must be an int or None, got {eos!r}")
  methods = ["init_cache", "step"] + (["encode"] if model.is_encoder_decoder
                                      else [])
  for meth in methods:
    if not callable(getattr(model, meth, None)):
      raise ValueError(f"{name} has no method {meth!r}; {hint}")
  _check_step_signature(model.step, name)


def _check_step_signature(step, name: str) -> None:
  """``step`` must take (params, tokens, cache) and the three keywords."""
  try:
    sig = inspect.signature(step)
  except (TypeError, ValueError):
    return  # builtins / C callables: nothing to inspect
  params = sig.parameters.values()
  if any(p.kind is p.VAR_KEYWORD for p in params):
    return
  names = {p.name for p in params
           if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
  missing = [k for k in _STEP_KEYWORDS if k not in names]
  if missing:
    raise ValueError(
        f"{name}.step{sig} does not accept the keyword {missing[0]!r}; the "
        f"decode interface is step(params, tokens, cache, *, positions=None, "
        f"mask=None, logits_at=None) (see specdec_jax/models/interface.py)")
  positional = [p for p in params
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
  if len(positional) < 3 and not any(p.kind is p.VAR_POSITIONAL
                                     for p in params):
    raise ValueError(f"{name}.step{sig} must take (params, tokens, cache) "
                     f"positionally")


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
