"""Loop state shared by every decode loop, and the helpers that update it.

A decode runs a stack of LEVELS, one per model, cheapest first (level 0 the
drafter q, the last level the verifier/target p; a pair is a two-level
stack). Each level keeps its own KV cache with per-row lengths and its own
counters (:class:`Level`). The emitted token stream is the same for every
loop (:class:`Stream`).

Conventions (every loop): a row's generated tokens go to ``tokens`` at
``num_out``; the last emitted token is ``pending`` and is *not yet* in any
cache (the next model call feeds it), so a prompt of length P is prefilled
with its first P - 1 tokens cached and its last token pending. A finished row
(``done``) is frozen: the body keeps computing it (fixed shapes) but none of
its state changes.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from specdec_jax.decoding import budget
from specdec_jax.decoding.rules.knobs import Static
from specdec_jax.decoding.rules.sampling import Temperature
from specdec_jax.decoding.verify.topology import Topology
from specdec_jax.models.cache import KVCache


@dataclasses.dataclass(frozen=True)
class LoopConfig:
  """Static configuration of a decode call (hashable, part of the jit key).

  Attributes:
    topology: the draft block (``Topology.chain(gamma)`` for a chain; a
      tree's ``TreeConfig`` keeps only its shape in the key; None for
      loops that draft no fixed block: stacks, autoregressive loops may
      still carry a chain).
    max_new: static output buffer size (>= every row's max_new_tokens).
    eos_id: end-of-sequence id, or None to ignore EOS.
    pad_id: filler of unused output slots.
    sampling: static half of the sampling transform; its knobs travel in
      ``Batch.sampling`` (``strategy = cfg.sampling.bind(batch.sampling)``).
    trace: record per-block accept/reject traces (speculative loops).
  """

  topology: Topology | None
  max_new: int
  eos_id: int | None
  pad_id: int = 0
  sampling: Static = Static(Temperature)
  trace: bool = False

  def strategy(self, batch: "Batch"):
    """The sampling transform with this batch's (traced) knobs."""
    return self.sampling.bind(batch.sampling)

  @property
  def gamma(self) -> int:
    """Draft depth: the number of drafted positions along a path."""
    return self.topology.max_depth


def capacity(prompt_width: int, cfg: LoopConfig, chunk: int = 0) -> int:
  """Cache slots of ``cfg`` (the one formula: ``budget.capacity``)."""
  return budget.capacity(prompt_width, cfg.max_new, cfg.topology.num_nodes,
                         chunk)


@struct.dataclass
class Request:
  """Per-row request parameters (all [batch]).

  Attributes:
    seed: [B] uint32 random seed of each request.
    request_id: [B] int32 id of each request (keys derive from it).
    max_new_tokens: [B] int32 tokens to generate at most (<= the static
      buffer size of the call).
  """

  seed: jax.Array
  request_id: jax.Array
  max_new_tokens: jax.Array


@struct.dataclass
class Batch:
  """Every per-row input of a decode call (all leading dims are [batch]).

  Attributes:
    prompt: [B, P] int32 decoder-side prompts, right-padded.
    prompt_len: [B] int32 prompt lengths (>= 1).
    inputs: [B, S] int32 encoder inputs (encoder-decoder) or None.
    req: per-row Request.
    sampling: sampling knobs, name -> [B] (e.g. {'temperature', 'p'}).
    knobs: method knobs, name -> [B] (e.g. {'alpha', 'beta'}).
    structure: per-row data of the draft structure
      (``structure_data.py``): None for a chain, ``TreeArrays`` for a
      tree, ``StackKnobs`` for a stack.
  """

  prompt: jax.Array
  prompt_len: jax.Array
  inputs: jax.Array | None
  req: Request
  sampling: dict
  knobs: dict
  structure: object = None


@struct.dataclass
class Level:
  """One model of the stack: its cache and its counters (all [batch]).

  Attributes:
    cache: the model's KVCache (None when the method does not run it).
    calls: [B] int32 calls of this model.
    drafted: [B] int32 tokens the level below proposed to this level.
    accepted: [B] int32 of those, accepted by this level.
    rejected: [B] int32 verification rounds that ended with a rejection
      (the estimate of the pair's alpha is accepted / (accepted +
      rejected): every accept test up to the first rejection counts).
  """

  cache: KVCache | None
  calls: jax.Array
  drafted: jax.Array
  accepted: jax.Array
  rejected: jax.Array

  @classmethod
  def start(cls, cache: KVCache | None, batch: int) -> "Level":
    z = jnp.zeros((batch,), jnp.int32)
    return cls(cache=cache, calls=z, drafted=z, accepted=z, rejected=z)

  def count(self, active: jax.Array, calls=0, drafted=0, accepted=0,
            rejected=0) -> "Level":
    """Adds counts ([B] or scalar) on active rows only."""
    add = lambda old, inc: old + jnp.where(active, inc, 0).astype(old.dtype)
    return self.replace(calls=add(self.calls, calls),
                        drafted=add(self.drafted, drafted),
                        accepted=add(self.accepted, accepted),
                        rejected=add(self.rejected, rejected))

  def keep_cache(self, active: jax.Array, new: KVCache) -> "Level":
    """The new cache, with the old lengths on inactive rows."""
    old = self.cache.lengths
    return self.replace(cache=new.with_lengths(
        jnp.where(active, new.lengths, old)))

  def stats(self) -> "LevelStats":
    return LevelStats(calls=self.calls, drafted=self.drafted,
                      accepted=self.accepted, rejected=self.rejected)


@struct.dataclass
class LevelStats:
  """Counters of one level (all [batch] int32); see :class:`Level`."""

  calls: jax.Array
  drafted: jax.Array
  accepted: jax.Array
  rejected: jax.Array


@struct.dataclass
class Stream:
  """The emitted token stream (shared by every loop).

  Attributes:
    step: [] int32 iterations done.
    tokens: [B, W] int32 generated tokens (W >= max_new + block width).
    num_out: [B] int32 tokens emitted so far.
    pending: [B] int32 last emitted token (in no cache yet).
    done: [B] bool finished rows (frozen).
    finite: [B] bool False once a row met a NaN/inf logit.
    deferrals: [B] float32 summed deferral mass of the emitted positions
      (delta for cascades, eta for token-specific rules).
  """

  step: jax.Array
  tokens: jax.Array
  num_out: jax.Array
  pending: jax.Array
  done: jax.Array
  finite: jax.Array
  deferrals: jax.Array

  @classmethod
  def start(cls, pending: jax.Array, req: Request, width: int,
            pad_id: int) -> "Stream":
    b = pending.shape[0]
    return cls(step=jnp.int32(0),
               tokens=jnp.full((b, width), pad_id, jnp.int32),
               num_out=jnp.zeros((b,), jnp.int32), pending=pending,
               done=req.max_new_tokens <= 0, finite=jnp.ones((b,), bool),
               deferrals=jnp.zeros((b,), jnp.float32))

  def emit(self, block: jax.Array, count: jax.Array, req: Request,
           cfg: LoopConfig, finite: jax.Array,
           defer: jax.Array | None = None) -> tuple["Stream", jax.Array]:
    """Appends the first ``count`` tokens of ``block`` to each active row.

    Truncates at the first EOS (kept) and at the row's budget; the last
    emitted token becomes ``pending``; rows that hit EOS, their budget or a
    non-finite logit are done.

    Args:
      block: [B, W] candidate tokens.
      count: [B] how many of them are real (1..W).
      req: per-row Request.
      cfg: LoopConfig (eos_id, pad_id).
      finite: [B] updated finiteness flags.
      defer: optional [B, W] deferral mass of each candidate position.

    Returns:
      (new stream with step + 1, [B] tokens actually emitted).
    """
    active = ~self.done
    tokens, num_out, finished, n = emit(
        self.tokens, self.num_out, block, count, active, cfg.eos_id,
        req.max_new_tokens, cfg.pad_id)
    last = jnp.take_along_axis(block, jnp.maximum(n - 1, 0)[:, None],
                               axis=1)[:, 0]
    deferrals = self.deferrals
    if defer is not None:
      iota = jnp.arange(block.shape[1])[None, :]
      deferrals = deferrals + jnp.sum(jnp.where(iota < n[:, None], defer,
                                                0.0), axis=1)
    return self.replace(
        step=self.step + 1, tokens=tokens, num_out=num_out,
        pending=jnp.where(active & (n > 0), last, self.pending),
        done=self.done | finished | ~finite, finite=finite,
        deferrals=deferrals), n


@struct.dataclass
class DraftState:
  """Loop state of a drafter/verifier pair (the chain and tree loops).

  Attributes:
    stream: the emitted token stream.
    levels: (drafter, verifier) levels: caches and counters.
    catchup: [B] int32 last accepted draft (chain) / accepted depth-D node
      (tree) the drafter has not cached.
    catchup_valid: [B] bool whether ``catchup`` must be fed first.
    trace: optional BlockTrace (``LoopConfig.trace``), else None.
  """

  stream: Stream
  levels: tuple[Level, Level]
  catchup: jax.Array
  catchup_valid: jax.Array
  trace: object = None


def prefill(model, params, prompt: jax.Array, prompt_len: jax.Array,
            cache: KVCache) -> tuple[KVCache, jax.Array]:
  """Caches prompt[:, :len - 1] of every row; returns (cache, pending).

  Args:
    model: a DecodeModel.
    params: its parameters.
    prompt: [B, P] int32 right-padded prompts (decoder side).
    prompt_len: [B] int32 lengths, >= 1.
    cache: empty cache.

  Returns:
    (cache with lengths prompt_len - 1, pending [B] = last prompt token).
  """
  if prompt.shape[1] > 1:
    at = jnp.zeros(prompt.shape[:1], jnp.int32)  # logits unused: project one
    _, cache = model.step(params, prompt, cache, logits_at=at)
  cache = cache.with_lengths(prompt_len - 1)
  pending = jnp.take_along_axis(prompt, (prompt_len - 1)[:, None], axis=1)[:, 0]
  return cache, pending.astype(jnp.int32)


def start_cache(model, params, batch: Batch,
                capacity_: int) -> tuple[KVCache, jax.Array]:
  """Encodes (encoder-decoder), allocates and prefills one model's cache.

  Returns:
    (cache, pending [B]).
  """
  encoded = (model.encode(params, batch.inputs) if model.is_encoder_decoder
             else None)
  cache = model.init_cache(batch.prompt.shape[0], capacity_, encoded)
  return prefill(model, params, batch.prompt, batch.prompt_len, cache)


def emit(tokens: jax.Array, num_out: jax.Array, block: jax.Array,
         count: jax.Array, active: jax.Array, eos_id: int | None,
         max_new: jax.Array, pad_id: int):
  """Appends the first ``count`` tokens of ``block`` to each active row.

  Truncates at the first EOS (kept) and at ``max_new`` tokens.

  Args:
    tokens: [B, N] output buffer (N >= max_new + block width).
    num_out: [B] tokens already emitted.
    block: [B, W] candidate tokens.
    count: [B] how many of them are real (1..W).
    active: [B] rows still decoding.
    eos_id: end-of-sequence id, or None.
    max_new: [B] per-row budget.
    pad_id: filler for unused slots.

  Returns:
    (tokens, num_out, finished [B] bool, count [B] actually emitted).
  """
  width = block.shape[1]
  iota = jnp.arange(width)[None, :]
  if eos_id is not None:
    is_eos = (block == eos_id) & (iota < count[:, None])  # [B, W]
    has_eos = jnp.any(is_eos, axis=1)
    count = jnp.where(has_eos, jnp.argmax(is_eos, axis=1) + 1, count)
  else:
    has_eos = jnp.zeros_like(active)
  count = jnp.minimum(count, max_new - num_out)
  block = jnp.where(iota < count[:, None], block, pad_id)
  write = jax.vmap(lambda buf, b, s: jax.lax.dynamic_update_slice_in_dim(
      buf, b, s, 0))
  new_tokens = write(tokens, block.astype(tokens.dtype), num_out)  # [B, N]
  tokens = jnp.where(active[:, None], new_tokens, tokens)
  count = jnp.where(active, count, 0)
  num_out = num_out + count
  finished = active & (has_eos | (num_out >= max_new))
  return tokens, num_out, finished, count


def all_finite(logits: jax.Array) -> jax.Array:
  """[B, ...] -> [B] bool: every entry of the row is finite."""
  return jnp.all(jnp.isfinite(logits.reshape(logits.shape[0], -1)), axis=1)
