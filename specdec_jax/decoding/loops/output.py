"""What a decode loop returns: the per-row output and the per-block trace.

Every loop (chain, tree, sequential, hierarchy) ends with :func:`output`
over its :class:`~state.Stream` and levels; ``return_trace=True`` loops also
fill a :class:`BlockTrace` block by block.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from specdec_jax.decoding.loops.state import LoopConfig, Stream


@struct.dataclass
class BlockTrace:
  """Per-block record of a speculative decode (``return_trace=True``).

  One class for chains and trees (a chain is a one-branch tree): ``N`` is
  the block's draft width, gamma for a chain, the node count for a tree.

  Attributes:
    drafts: [B, blocks, N] int32 drafted tokens (chain order / node order).
    accept: [B, blocks, N] bool the accept test of each draft (chain: drafts
      after the first rejection were tested but not used; tree: False for
      untested nodes).
    accepted: [B, blocks] int32 drafts accepted (-1: no block).
    token: [B, blocks] int32 the token emitted after them (the residual or
      bonus draw).
  """

  drafts: jax.Array
  accept: jax.Array
  accepted: jax.Array
  token: jax.Array

  @classmethod
  def start(cls, batch: int, blocks: int, n: int) -> "BlockTrace":
    return cls(drafts=jnp.zeros((batch, blocks, n), jnp.int32),
               accept=jnp.zeros((batch, blocks, n), bool),
               accepted=jnp.full((batch, blocks), -1, jnp.int32),
               token=jnp.zeros((batch, blocks), jnp.int32))

  def record(self, step, active, drafts, accept, accepted, token):
    """Writes block ``step`` of the active rows ([B] bool)."""
    put = lambda buf, x: buf.at[:, step].set(
        jnp.where(active.reshape((-1,) + (1,) * (x.ndim - 1)), x,
                  buf[:, step]))
    return BlockTrace(drafts=put(self.drafts, drafts),
                      accept=put(self.accept, accept),
                      accepted=put(self.accepted, accepted),
                      token=put(self.token, token))


@struct.dataclass
class LoopOutput:
  """What every decode loop returns (device arrays).

  Attributes:
    tokens: [B, W >= max_new] int32 generated tokens, pad after the end.
    num_out: [B] int32 number of generated tokens per row.
    levels: one LevelStats per level of the stack (cheapest first).
    deferrals: [B] float32 summed deferral mass.
    finite: [B] bool, False if the row met a NaN/inf logit.
    confidence: [B] float32 sum of log max q over the response
      (autoregressive programs; SeqCascade's deferral statistic), or None.
    trace: optional per-block trace (``return_trace``), or None.
  """

  tokens: jax.Array
  num_out: jax.Array
  levels: tuple
  deferrals: jax.Array
  finite: jax.Array
  confidence: jax.Array | None = None
  trace: object = None


def output(stream: Stream, levels, cfg: LoopConfig, confidence=None,
           trace=None) -> LoopOutput:
  """The LoopOutput of a finished loop state."""
  return LoopOutput(tokens=stream.tokens[:, :cfg.max_new],
                    num_out=stream.num_out,
                    levels=tuple(lv.stats() for lv in levels),
                    deferrals=stream.deferrals, finite=stream.finite,
                    confidence=confidence, trace=trace)
