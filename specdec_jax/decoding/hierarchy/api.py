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

from typing import Sequence

from specdec_jax.decoding import methods as methods_lib
from specdec_jax.decoding.hierarchy.stack import check_levels
from specdec_jax.decoding.api import decode
from specdec_jax.decoding.result import DecodeResult
from specdec_jax.decoding.strategy import Stack, Strategy


def generate_hierarchy(levels: Sequence, buffers: Sequence[int],
                       prompts=None, *, method=None, lenient=None,
                       inputs=None, sampling=None,
                       max_new_tokens: int | Sequence[int] = 32, seeds=0,
                       request_ids=None, eos_id: int | None | str = "auto",
                       pad_id: int = 0, on_nonfinite: str = "raise",
                       mesh=None, pad_to: int | None = None) -> DecodeResult:
  """Hierarchical speculative decoding (HSD, Globerson et al.).

  A thin wrapper, kept for its signature: it is ``decoding.decode(
  Strategy(method, Stack(buffers, lenient), sampling), models, params,
  ...)`` (``request.py``).

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
  models, params, buffers = check_levels(levels, buffers)
  method = methods_lib.Speculative() if method is None else method
  strategy = Strategy(method, Stack(buffers, lenient), sampling)
  return decode(strategy, models, params, prompts, inputs=inputs,
                max_new_tokens=max_new_tokens, seeds=seeds,
                request_ids=request_ids, eos_id=eos_id, pad_id=pad_id,
                on_nonfinite=on_nonfinite, mesh=mesh, pad_to=pad_to)
