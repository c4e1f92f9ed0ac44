"""Decoding methods: a static rule plus traced knobs, and the loop they run.

A method object is what a user builds (``make_method('opt', alpha=0.2)``,
``Speculative(TokenV3(alpha=0.3))``). It never enters ``jit`` itself:

* ``knobs()`` -- its numbers (alpha, beta, ...), a dict that becomes [B]
  arrays in the batch (traced: new values never recompile);
* ``program(models, cfg)`` -- RETURNS the decode loop (a ``LoopProgram``
  whose hashable key holds the rule's class and static fields), which
  ``generate`` runs;
* ``validate()`` -- range checks with clear errors, before anything runs.

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

import dataclasses
from typing import Any, Protocol

import jax

from specdec_jax.decoding.loops import sequential, speculative
from specdec_jax.decoding.loops.drafting import FallbackStop
from specdec_jax.decoding.loops.program import LoopProgram
from specdec_jax.decoding.loops.state import LoopConfig
from specdec_jax.decoding.loops.token_cascade import token_cascade_program
from specdec_jax.decoding.rules import cascades, targets
from specdec_jax.decoding.rules.knobs import Static, split


class Method(Protocol):
  """What ``generate`` needs from a decoding method."""

  uses_drafter: bool
  greedy_only: bool

  def knobs(self) -> dict[str, Any]:
    ...

  def validate(self) -> None:
    ...

  def program(self, models: tuple, cfg: LoopConfig) -> LoopProgram:
    ...


@dataclasses.dataclass(frozen=True)
class TargetRule:
  """Static rule of :class:`Speculative`: the target's static half."""

  target: Static

  def bind(self, knobs):
    return self.target.bind(knobs), None


@dataclasses.dataclass(frozen=True)
class BiLDRule:
  """Static rule of :class:`BiLD`: rollback target plus fallback stop."""

  def bind(self, knobs):
    return (targets.BiLDRollback(alpha=knobs["alpha_rollback"]),
            FallbackStop(alpha=knobs["alpha_fallback"]))


@dataclasses.dataclass(frozen=True)
class Speculative:
  """Generic speculative sampling (Alg. 4) toward ``target``."""

  target: Any = dataclasses.field(default_factory=targets.SpecDecode)
  uses_drafter = True
  traces = True
  trees = True  # runs on draft trees (generate(..., tree=Tree(...)))

  @property
  def greedy_only(self) -> bool:
    return isinstance(self.target, targets.GREEDY_ONLY)

  def knobs(self) -> dict[str, Any]:
    return split(self.target)[1]

  def validate(self) -> None:
    self.target.validate()

  def rule(self) -> TargetRule:
    """The static rule the chain, tree and stack loops verify with."""
    return TargetRule(split(self.target)[0])

  def program(self, models, cfg: LoopConfig) -> LoopProgram:
    """The chain loop (trees and stacks: ``request.build_program``)."""
    return speculative.chain_program(models, cfg, self.rule())


@dataclasses.dataclass(frozen=True)
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
  uses_drafter = True
  greedy_only = True
  traces = True

  def knobs(self) -> dict[str, Any]:
    return dict(alpha_fallback=self.alpha_fallback,
                alpha_rollback=self.alpha_rollback)

  def validate(self) -> None:
    targets.check_range("BiLD alpha_fallback", self.alpha_fallback, 0.0, 1.0)
    targets.BiLDRollback(self.alpha_rollback).validate()

  def program(self, models, cfg: LoopConfig) -> LoopProgram:
    return speculative.chain_program(models, cfg, BiLDRule())


@dataclasses.dataclass(frozen=True)
class TargetOnly:
  """Autoregressive sampling with the verifier alone (the baseline)."""

  uses_drafter = False
  greedy_only = False

  def knobs(self) -> dict[str, Any]:
    return {}

  def validate(self) -> None:
    return None

  def program(self, models, cfg: LoopConfig) -> LoopProgram:
    return sequential.autoregressive_program(models, cfg, level=1)


@dataclasses.dataclass(frozen=True)
class DrafterOnly:
  """Autoregressive sampling with the drafter alone."""

  uses_drafter = True
  greedy_only = False

  def knobs(self) -> dict[str, Any]:
    return {}

  def validate(self) -> None:
    return None

  def program(self, models, cfg: LoopConfig) -> LoopProgram:
    return sequential.autoregressive_program(models, cfg, level=0)


@dataclasses.dataclass(frozen=True)
class TokenCascade:
  """TokenCascade[Chow] (Alg. 2): verifier only for deferred tokens.

  The verifier's cache is prefilled with the prompt once; before scoring a
  deferred position it catches up on the tokens generated since its last
  call in blocks of ``chunk`` (static) tokens.
  """

  alpha: jax.Array = 0.5
  chunk: int = 16
  uses_drafter = True
  greedy_only = False

  def knobs(self) -> dict[str, Any]:
    return dict(alpha=self.alpha)

  def validate(self) -> None:
    cascades.Chow(self.alpha).validate()
    if self.chunk < 1:
      raise ValueError(f"TokenCascade chunk must be >= 1, got {self.chunk}")

  def program(self, models, cfg: LoopConfig) -> LoopProgram:
    rule = split(cascades.Chow())[0]
    return token_cascade_program(models, cfg, rule, int(self.chunk))


@dataclasses.dataclass(frozen=True)
class OracleCascade:
  """OracleCascade (Alg. 3): both models every token, token ~ T(q, p)."""

  target: Any = dataclasses.field(default_factory=cascades.Diff)
  uses_drafter = True

  @property
  def greedy_only(self) -> bool:
    return isinstance(self.target, targets.GREEDY_ONLY)

  def knobs(self) -> dict[str, Any]:
    return split(self.target)[1]

  def validate(self) -> None:
    self.target.validate()

  def program(self, models, cfg: LoopConfig) -> LoopProgram:
    return sequential.oracle_program(models, cfg, split(self.target)[0])


@dataclasses.dataclass(frozen=True)
class SeqCascade:
  """SeqCascade[Chow]: whole response by the drafter or by the verifier.

  The drafter's sequence confidence is ``prod_t max q_t`` over its response
  (unscaled q); a row defers when it is below ``1 - alpha``, and the
  verifier then decodes that row's whole response. A deferred row counts all
  its tokens as deferred.
  """

  alpha: jax.Array = 0.5
  uses_drafter = True
  greedy_only = False

  def knobs(self) -> dict[str, Any]:
    return dict(alpha=self.alpha)

  def validate(self) -> None:
    targets.check_range("SeqCascade alpha", self.alpha, 0.0, 1.0)

  def program(self, models, cfg: LoopConfig) -> LoopProgram:
    return sequential.seq_cascade_program(models, cfg)
