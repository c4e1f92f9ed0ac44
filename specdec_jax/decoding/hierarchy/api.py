"""``generate_hierarchy``: decode with a stack of K drafters and a target.

    from specdec_jax import decoding, models
    target = models.get_model("gemma2_tiny")
    mid = models.early_exit(target, 1)          # first layer + norm + head
    out = decoding.generate_hierarchy(
        levels=[(small, small_params), (mid, target_params),
                (target, target_params)],
        buffers=[3, 6], prompts=[[2, 17, 5]], max_new_tokens=32)
    out.calls            # [B, 3] model calls per level
    out.level_acceptance()   # [nan, alpha(0 -> 1), alpha(1 -> 2)]

The output is distributed exactly as the target for lossless levels
(SpecDecode at every level), whatever the models and buffers. The top level
may verify with ANY speculative target of the engine (``method=``, e.g. a
speculative cascade over the hierarchy's drafts), and an intermediate level
may be lenient (``lenient={n: method}``, a cascade target) while the top
stays exact: the output is then still exactly the target's.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from specdec_jax.decoding import inputs as inputs_lib
from specdec_jax.decoding import methods as methods_lib
from specdec_jax.decoding.api import DecodeResult, check_memory, result
from specdec_jax.decoding.hierarchy import loop
from specdec_jax.decoding.loops.program import run_program
from specdec_jax.decoding.loops.state import LoopConfig
from specdec_jax.decoding.rules import sampling as sampling_lib
from specdec_jax.decoding.rules import targets
from specdec_jax.decoding.rules.knobs import split
from specdec_jax.decoding.verify.topology import Topology


def check_levels(levels, buffers) -> tuple[tuple, tuple, tuple[int, ...]]:
  """(models, params, buffers) of a stack; ValueError for a bad stack."""
  levels = list(levels)
  if len(levels) < 2:
    raise ValueError(f"a hierarchy needs at least two levels (a drafter and "
                     f"the target), got {len(levels)}")
  for i, lv in enumerate(levels):
    if not (isinstance(lv, (tuple, list)) and len(lv) == 2):
      raise ValueError(f"levels[{i}] must be a (model, params) pair, got "
                       f"{type(lv).__name__}")
  models = tuple(m for m, _ in levels)
  for i, m in enumerate(models):
    inputs_lib.check_decode_model(m, f"level {i}")
  for i, m in enumerate(models[1:], 1):
    if m.vocab_size != models[0].vocab_size:
      raise ValueError(
          f"level {i} has a vocabulary of {m.vocab_size} ids but level 0 has "
          f"{models[0].vocab_size}: every level must share the tokenizer "
          f"(speculative sampling compares distributions token by token)")
    if m.is_encoder_decoder != models[0].is_encoder_decoder:
      raise ValueError(f"level {i} and level 0 must both be encoder-decoder "
                       f"or both decoder-only")
  buffers = list(buffers)
  if len(buffers) != len(levels) - 1:
    raise ValueError(f"{len(levels)} levels need {len(levels) - 1} buffer "
                     f"sizes (T_0 .. T_K-1), got {len(buffers)}: {buffers}")
  for i, t in enumerate(buffers):
    if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 1:
      raise ValueError(f"buffer T_{i} must be an integer >= 1, got {t!r}")
  return models, tuple(p for _, p in levels), tuple(int(t) for t in buffers)


def _lenient(lenient: Mapping[int, object] | None, depth: int, top):
  """(static rules per intermediate level, prefixed knobs)."""
  rules, knobs = [None] * (depth - 1), {}
  for n, method in dict(lenient or {}).items():
    if not (isinstance(n, (int, np.integer)) and 1 <= n <= depth - 1):
      raise ValueError(f"lenient levels are the intermediate ones, 1.."
                       f"{depth - 1}; got level {n!r}")
    target = getattr(method, "target", None)
    if not isinstance(method, methods_lib.Speculative) or target is None:
      raise ValueError(f"lenient level {n} needs a speculative method (e.g. "
                       f"make_method('token_v3', alpha=0.5)), got "
                       f"{type(method).__name__}")
    method.validate()
    static, k = split(target)
    rules[n - 1] = static
    knobs.update({f"level{n}.{name}": v for name, v in k.items()})
  if any(r is not None for r in rules) and not isinstance(
      top.target, targets.SpecDecode):
    raise ValueError("lenient intermediate levels need an exact top level "
                     "(method=spec_decode): the top must correct their "
                     "leniency for the output to stay the target's")
  return tuple(rules), knobs


class _HierarchyMethod:
  """A Speculative method whose knobs include the lenient levels'."""

  uses_drafter = True

  def __init__(self, top, extra_knobs):
    self.top, self.extra = top, extra_knobs
    self.greedy_only = top.greedy_only

  def knobs(self):
    return {**self.top.knobs(), **self.extra}


def generate_hierarchy(levels: Sequence, buffers: Sequence[int],
                       prompts=None, *, method=None, lenient=None,
                       inputs=None, sampling=None,
                       max_new_tokens: int | Sequence[int] = 32, seeds=0,
                       request_ids=None, eos_id: int | None | str = "auto",
                       pad_id: int = 0, on_nonfinite: str = "raise",
                       mesh=None, pad_to: int | None = None) -> DecodeResult:
  """Hierarchical speculative decoding (HSD, Globerson et al.).

  Args:
    levels: [(model_0, params_0), ..., (model_K, params_K)], cheapest first,
      model_K the target; models share one vocabulary (an early exit of the
      target, ``models.early_exit(target, k)``, takes the target's params).
    buffers: [T_0, ..., T_{K-1}]: level 0 drafts T_0 tokens per batch;
      level n accumulates verified tokens until it holds >= T_n.
    prompts, inputs, sampling, max_new_tokens, seeds, request_ids, eos_id,
      pad_id, on_nonfinite, mesh, pad_to: as in ``decoding.generate``.
    method: the top level's speculative method (default SpecDecode: exact;
      any target of the engine, e.g. ``make_method('token_v3', alpha=.3)``).
    lenient: optional {n: speculative cascade method} for intermediate
      levels 1..K-1 (the top must then be SpecDecode).

  Returns:
    DecodeResult; ``calls`` / ``level_drafted`` / ``level_accepted`` are
    [B, K + 1] per level and ``level_acceptance()`` the measured alpha of
    each adjacent pair.
  """
  if on_nonfinite not in ("raise", "return"):
    raise ValueError(f"on_nonfinite must be 'raise' or 'return', got "
                     f"{on_nonfinite!r}")
  models, params, buffers = check_levels(levels, buffers)
  method = methods_lib.Speculative() if method is None else method
  if not isinstance(method, methods_lib.Speculative):
    raise ValueError(f"the top level verifies with a speculative method "
                     f"(make_method('spec_decode'), a lossy or cascade "
                     f"rule), got {type(method).__name__}")
  strategy = sampling_lib.Greedy() if sampling is None else sampling
  inputs_lib.check_method(method, strategy)
  rules, extra = _lenient(lenient, len(buffers), method)
  stack = loop.Stack(buffers=buffers, lenient=rules)
  verifier = models[-1]
  batch, rows, max_new, width = inputs_lib.prepare_batch(
      _HierarchyMethod(method, extra), verifier, strategy, prompts=prompts,
      inputs=inputs, max_new_tokens=max_new_tokens, seeds=seeds,
      request_ids=request_ids, pad_to=pad_to, mesh=mesh)
  if eos_id == "auto":
    eos_id = getattr(verifier, "eos_id", None)
  inputs_lib.check_special_ids(eos_id, pad_id, verifier.vocab_size)
  if stack.context_width(width, max_new) >= inputs_lib.MAX_POSITIONS:
    raise ValueError("prompt + max_new_tokens + buffers exceed int32 "
                     "positions; ask for fewer tokens")
  cfg = LoopConfig(topology=Topology.chain(1), max_new=max_new,
                   eos_id=eos_id, pad_id=pad_id,
                   sampling=inputs_lib.sampling_static(strategy))
  program = loop.program(models, cfg, stack, split(method.target)[0])
  args = (params, batch)
  check_memory(program, args, mesh)
  res = result(run_program(program, args, mesh), rows, max_new)
  if on_nonfinite == "raise" and not res.finite.all():
    raise FloatingPointError(
        f"non-finite logits (NaN/inf) in rows "
        f"{np.nonzero(~res.finite)[0].tolist()}; pass on_nonfinite='return'"
        f" to get partial output")
  return res
