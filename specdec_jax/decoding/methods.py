"""Decoding methods: which loop runs, with which target and knobs.

A method is a small frozen pytree; its knobs (alpha, beta) are traced leaves
(the method object travels in ``batch.method``). ``run(drafter, verifier,
q_params, p_params, batch, cfg, mesh=None)`` builds the method's loop
program(s) and runs them (see ``program.py``). :func:`make_method` builds a method
from a name and keyword knobs (the CLI and gin files use it).

    Speculative(target)       Alg. 4 with any target T(q, p) (SpecDecode,
                              Lossy, cascades Chow/Diff/OPT, TokenV1-3,
                              BiLD*, LossyGreedy)
    BiLD(alpha_fallback, alpha_rollback)   original deterministic BiLD
    TargetOnly(), DrafterOnly()            autoregressive baselines
    TokenCascade(alpha)       sequential token-level Chow cascade (Alg. 2)
    OracleCascade(target)     both models every token (Alg. 3)
    SeqCascade(alpha)         sequence-level Chow cascade
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from specdec_jax.decoding import program as program_lib
from specdec_jax.decoding import sequential, speculative, targets
from specdec_jax.decoding.speculative import LoopOutput
from specdec_jax.decoding.state import Stats


def _run(prog, q_params, p_params, batch, mesh) -> LoopOutput:
  return program_lib.run_program(prog, (q_params, p_params, batch), mesh)


@struct.dataclass
class Speculative:
  """Generic speculative sampling (Alg. 4) toward ``target``."""

  target: Any = struct.field(default_factory=targets.SpecDecode)
  uses_drafter: bool = struct.field(pytree_node=False, default=True)

  @property
  def greedy_only(self) -> bool:
    return isinstance(self.target, targets.GREEDY_ONLY)

  def spec_target(self):
    return self.target

  def validate(self) -> None:
    self.target.validate()

  def run(self, drafter, verifier, q_params, p_params, batch, cfg,
          mesh=None):
    prog = speculative.speculative_program(drafter, verifier, cfg, False)
    return _run(prog, q_params, p_params, batch, mesh)


@struct.dataclass
class BiLD:
  """Big Little Decoder (Kim et al. 2023), deterministic (greedy).

  Fallback: the drafter drafts until its confidence ``max q`` drops below
  ``alpha_fallback`` or ``gamma`` (the max draft window) tokens are drafted.
  Rollback: the verifier scores the drafts in one block and rolls back at the
  first draft with ``-log p(draft) > alpha_rollback``, continuing from the
  verifier's argmax.
  """

  alpha_fallback: jax.Array = 0.5
  alpha_rollback: jax.Array = 2.0
  uses_drafter: bool = struct.field(pytree_node=False, default=True)
  greedy_only: bool = struct.field(pytree_node=False, default=True)

  def spec_target(self) -> targets.BiLDRollback:
    return targets.BiLDRollback(self.alpha_rollback)

  def spec_stop(self) -> speculative.FallbackStop:
    return speculative.FallbackStop(self.alpha_fallback)

  def validate(self) -> None:
    targets._check_range("BiLD alpha_fallback", self.alpha_fallback, 0.0, 1.0)  # pylint: disable=protected-access
    self.spec_target().validate()

  def run(self, drafter, verifier, q_params, p_params, batch, cfg,
          mesh=None):
    prog = speculative.speculative_program(drafter, verifier, cfg, True)
    return _run(prog, q_params, p_params, batch, mesh)


@struct.dataclass
class TargetOnly:
  """Autoregressive sampling with the verifier alone (the baseline)."""

  uses_drafter: bool = struct.field(pytree_node=False, default=False)
  greedy_only: bool = struct.field(pytree_node=False, default=False)

  def validate(self) -> None:
    return None

  def run(self, drafter, verifier, q_params, p_params, batch, cfg,
          mesh=None):
    prog = sequential.autoregressive_program(verifier, cfg, "verifier")
    return _run(prog, q_params, p_params, batch, mesh)


@struct.dataclass
class DrafterOnly:
  """Autoregressive sampling with the drafter alone."""

  uses_drafter: bool = struct.field(pytree_node=False, default=True)
  greedy_only: bool = struct.field(pytree_node=False, default=False)

  def validate(self) -> None:
    return None

  def run(self, drafter, verifier, q_params, p_params, batch, cfg,
          mesh=None):
    prog = sequential.autoregressive_program(drafter, cfg, "drafter")
    return _run(prog, q_params, p_params, batch, mesh)


@struct.dataclass
class TokenCascade:
  """TokenCascade[Chow] (Alg. 2): verifier only for deferred tokens.

  The verifier's cache is prefilled with the prompt once; before scoring a
  deferred position it catches up on the tokens generated since its last
  call in blocks of ``chunk`` (static) tokens.
  """

  alpha: jax.Array = 0.5
  chunk: int = struct.field(pytree_node=False, default=16)
  uses_drafter: bool = struct.field(pytree_node=False, default=True)
  greedy_only: bool = struct.field(pytree_node=False, default=False)

  def validate(self) -> None:
    targets.Chow(self.alpha).validate()
    if self.chunk < 1:
      raise ValueError(f"TokenCascade chunk must be >= 1, got {self.chunk}")

  def run(self, drafter, verifier, q_params, p_params, batch, cfg,
          mesh=None):
    prog = sequential.token_cascade_program(drafter, verifier, cfg,
                                            self.chunk)
    return _run(prog, q_params, p_params, batch, mesh)


@struct.dataclass
class OracleCascade:
  """OracleCascade (Alg. 3): both models every token, token ~ T(q, p)."""

  target: Any = struct.field(default_factory=targets.Diff)
  uses_drafter: bool = struct.field(pytree_node=False, default=True)

  @property
  def greedy_only(self) -> bool:
    return isinstance(self.target, targets.GREEDY_ONLY)

  def validate(self) -> None:
    self.target.validate()

  def run(self, drafter, verifier, q_params, p_params, batch, cfg,
          mesh=None):
    prog = sequential.oracle_program(drafter, verifier, cfg)
    return _run(prog, q_params, p_params, batch, mesh)


@struct.dataclass
class SeqCascade:
  """SeqCascade[Chow]: whole response by the drafter or by the verifier.

  The drafter's sequence confidence is ``prod_t max q_t`` over its response
  (unscaled q); a row defers when it is below ``1 - alpha``, and the
  verifier then decodes that row's whole response. A deferred row counts all
  its tokens as deferred.
  """

  alpha: jax.Array = 0.5
  uses_drafter: bool = struct.field(pytree_node=False, default=True)
  greedy_only: bool = struct.field(pytree_node=False, default=False)

  def validate(self) -> None:
    targets._check_range("SeqCascade alpha", self.alpha, 0.0, 1.0)  # pylint: disable=protected-access

  def run(self, drafter, verifier, q_params, p_params, batch, cfg,
          mesh=None):
    first = _run(sequential.autoregressive_program(drafter, cfg, "drafter"),
                 q_params, p_params, batch, mesh)
    alpha = jnp.asarray(batch.method.alpha, jnp.float32)  # [B], padded
    floor = jnp.log(jnp.maximum(1.0 - alpha, 1e-30))
    defer = (first.confidence < floor) & (batch.req.max_new_tokens > 0)
    req = batch.req.replace(max_new_tokens=jnp.where(
        defer, batch.req.max_new_tokens, 0))
    verifier_prog = sequential.autoregressive_program(verifier, cfg,
                                                      "verifier")

    def redo(_):
      return _run(verifier_prog, q_params, p_params, batch.replace(req=req),
                  mesh)

    def skip(_):  # nothing deferred: no verifier pass at all
      return first.replace(stats=Stats.zeros(defer.shape[0]))

    any_defer = jnp.any(defer)
    if isinstance(any_defer, jax.core.Tracer):
      # Inside a caller's jit (e.g. t5x's pjit of predict_batch_with_aux):
      # lax.cond, so only the taken branch runs.
      second = jax.lax.cond(any_defer, redo, skip, None)
    else:
      # Eagerly, a host check. (An eager lax.cond would close over the
      # parameters and this batch as constants: a new compilation, holding
      # a copy of the weights, on every call.)
      second = redo(None) if bool(any_defer) else skip(None)
    pick = lambda a, c: jnp.where(
        defer.reshape(defer.shape + (1,) * (a.ndim - 1)), c, a)
    num_out = pick(first.num_out, second.num_out)
    stats = first.stats.replace(
        verifier_calls=second.stats.verifier_calls,
        deferrals=jnp.where(defer, num_out, 0).astype(jnp.float32))
    return LoopOutput(tokens=pick(first.tokens, second.tokens),
                      num_out=num_out, stats=stats,
                      finite=first.finite & (~defer | second.finite),
                      confidence=first.confidence)


def _spec(target_cls, **fixed):
  return lambda **kw: Speculative(target_cls(**fixed, **kw))


# name -> constructor taking the method's knobs as keywords.
METHODS = {
    "target_only": TargetOnly,
    "drafter_only": DrafterOnly,
    "spec_decode": _spec(targets.SpecDecode),
    "lossy": _spec(targets.Lossy),
    "lossy_tuned": _spec(targets.Lossy, tuned=True),
    "lossy_greedy": _spec(targets.LossyGreedy),
    "chow": _spec(targets.Chow),
    "diff": _spec(targets.Diff),
    "opt": _spec(targets.OPT),
    "chow_log": _spec(targets.Chow, loss="log"),
    "diff_log": _spec(targets.Diff, loss="log"),
    "opt_log": _spec(targets.OPT, loss="log"),
    "token_v1": _spec(targets.TokenV1),
    "token_v2": _spec(targets.TokenV2),
    "token_v3": _spec(targets.TokenV3),
    "bild_star": _spec(targets.BiLDStar),
    "bild": BiLD,
    "token_cascade": TokenCascade,
    "oracle_diff": lambda **kw: OracleCascade(targets.Diff(**kw)),
    "oracle_opt": lambda **kw: OracleCascade(targets.OPT(**kw)),
    "seq_cascade": SeqCascade,
}


def make_method(name: str, **knobs):
  """A method by name, e.g. ``make_method('opt', alpha=0.2)``.

  Args:
    name: one of :data:`METHODS`.
    **knobs: the method's knobs (alpha, beta, alpha_fallback, ...).

  Raises:
    ValueError for an unknown name or knob.
  """
  if name not in METHODS:
    raise ValueError(f"unknown method {name!r}; choose one of "
                     f"{', '.join(sorted(METHODS))}")
  try:
    return METHODS[name](**knobs)
  except TypeError as e:
    raise ValueError(f"bad knobs {sorted(knobs)} for method {name!r}: {e}"
                     ) from None
