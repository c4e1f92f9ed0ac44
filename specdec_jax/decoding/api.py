"""Public entry points: ``decode`` and ``generate`` (a thin wrapper).

    from specdec_jax import decoding, models
    drafter, verifier = models.get_model(...), models.get_model(...)
    out = decoding.generate(
        decoding.make_method("token_v3", alpha=0.3), drafter, verifier,
        q_params, p_params, prompts=[[2, 17, 5], [2, 9]],
        sampling=decoding.TopP(p=0.9, temperature=0.5), gamma=5,
        max_new_tokens=64, seeds=0)
    out.sequences(), out.acceptance_rate, out.block_efficiency

:func:`decode` is the one request path of every structure (its steps are
in ``request.py``); ``generate`` keeps its signature for user code and t5x
gin files: it builds the :class:`~strategy.Strategy` ``Strategy(method,
Chain(gamma) or tree, sampling)`` and calls ``decode``. Prompt widths are padded
to a multiple of ``PAD_TO`` so new prompts reuse compiled programs; knobs
(alpha, beta, temperature, top-p, seeds) are traced and never recompile.
"""

from __future__ import annotations

from typing import Sequence

from specdec_jax.decoding import inputs as inputs_lib
from specdec_jax.decoding import request
from specdec_jax.decoding.budget import check_capacity, check_memory
from specdec_jax.decoding.loops.program import run_program
from specdec_jax.decoding.result import (DecodeResult, raise_nonfinite,
                                         result)
from specdec_jax.decoding.strategy import (Stack, Strategy, Tree,
                                           as_structure)

PAD_TO = inputs_lib.PAD_TO

def _check_options(strategy: Strategy, on_nonfinite: str,
                   return_trace: bool) -> None:
  if on_nonfinite not in ("raise", "return"):
    raise ValueError(f"on_nonfinite must be 'raise' or 'return', got "
                     f"{on_nonfinite!r}")
  method = strategy.method
  if return_trace and (isinstance(strategy.structure, Stack) or not getattr(
      method, "traces", False)):
    what = ("a stack" if isinstance(strategy.structure, Stack)
            else type(method).__name__)
    raise ValueError(f"return_trace=True records draft blocks; {what} "
                     f"drafts none (use a speculative method on a chain or "
                     f"a tree)")


def _check_size(strategy: Strategy, cfg: LoopConfig, width: int,
                max_cache_length: int | None) -> None:
  """Cache slots of the request against the bound and int32 positions."""
  structure = strategy.structure
  if not isinstance(structure, Stack):
    check_capacity(width, cfg.max_new, cfg,
                          isinstance(structure, Tree), max_cache_length)
    return
  need = request.StackShape(structure.buffers).context_width(width,
                                                            cfg.max_new)
  if need >= inputs_lib.MAX_POSITIONS:
    raise ValueError("prompt + max_new_tokens + buffers exceed int32 "
                     "positions; ask for fewer tokens")
  if max_cache_length is not None and need > max_cache_length:
    raise ValueError(f"prompt ({width} padded) + max_new_tokens "
                     f"({cfg.max_new}) + the stack's buffers need {need} "
                     f"cache slots, more than max_cache_length "
                     f"({max_cache_length}); shorten the prompt, "
                     f"max_new_tokens or the buffers")


def _auto(strategy, models, params, tune, sampling, prompts, inputs):
  """(strategy, models, params) of ``strategy='auto'``."""
  if not (isinstance(strategy, str) and strategy == "auto"):
    raise ValueError(f"strategy must be a decoding.Strategy or 'auto' (with "
                     f"tune=); got {strategy!r}"
                     + ("" if isinstance(strategy, str) else
                        " with tune= / sampling=, which only 'auto' takes"))
  if tune is None:
    raise ValueError("strategy='auto' needs tune=: an AutoTable "
                     "(decoding.planners.tune(...)) or a tune file path "
                     "(`specdec_jax tune`)")
  from specdec_jax.decoding.planners import auto  # pylint: disable=g-import-not-at-top
  rows = inputs if prompts is None else prompts
  if rows is None:
    raise ValueError("strategy='auto' picks its row by batch size: give "
                     "prompts= or inputs=")
  return auto.as_table(tune).select(models, params, len(rows), sampling)


def decode(strategy: Strategy, models: Sequence, params: Sequence,
           prompts=None, *, inputs=None,
           max_new_tokens: int | Sequence[int] = 32, seeds=0,
           request_ids=None, eos_id: int | None | str = "auto",
           pad_id: int = 0, max_cache_length: int | None = None,
           on_nonfinite: str = "raise", mesh=None,
           pad_to: int | None = None,
           return_trace: bool = False, tune=None,
           sampling=None) -> DecodeResult:
  """Decodes a batch with ``strategy`` (the one request path).

  Args:
    strategy: a :class:`~strategy.Strategy` (method + structure +
      sampling), or ``'auto'``: the row of ``tune`` (an ``AutoTable`` from
      ``planners.tune`` or a tune file's path) for this batch -- the row of
      the largest tuned batch size <= the number of rows -- on the models
      the table was tuned with (``models``: all of them, cheapest first).
    tune: the auto table or its path (``strategy='auto'`` only).
    sampling: with ``'auto'``, overrides the table's sampling (default:
      Temperature(the temperature it was tuned at)).
    models: the levels, cheapest first: (drafter, verifier) for a Chain or
      a Tree (the drafter is ignored by methods that do not use it), K + 1
      models for a ``Stack`` of K buffers (the target last).
    params: their parameters, one per model.
    prompts, inputs, max_new_tokens, seeds, request_ids, eos_id, pad_id,
      max_cache_length, on_nonfinite, mesh, pad_to, return_trace: as in
      ``decoding.generate``.

  Returns:
    DecodeResult (per-level counters ``calls`` etc. are [B, len(models)]).
  """
  if isinstance(strategy, str) or tune is not None or sampling is not None:
    strategy, models, params = _auto(strategy, models, params, tune,
                                     sampling, prompts, inputs)
  _check_options(strategy, on_nonfinite, return_trace)
  models, params = request.check(strategy, models, params)
  verifier = models[-1]
  req = request.prepare(strategy, verifier, prompts=prompts, inputs=inputs,
                        max_new_tokens=max_new_tokens, seeds=seeds,
                        request_ids=request_ids, pad_to=pad_to, mesh=mesh)
  if eos_id == "auto":
    eos_id = getattr(verifier, "eos_id", None)
  inputs_lib.check_special_ids(eos_id, pad_id, verifier.vocab_size)
  cfg = request.loop_config(strategy, verifier.vocab_size,
                            max_new=req.max_new, eos_id=eos_id,
                            pad_id=pad_id, trace=bool(return_trace))
  _check_size(strategy, cfg, req.width, max_cache_length)
  batch = request.with_structure(req.batch, strategy, cfg)
  program = request.build_program(strategy, models, cfg)
  args = (params, batch)
  check_memory(program, args, mesh)
  res = result(run_program(program, args, mesh), req.rows, req.max_new)
  if on_nonfinite == "raise":
    raise_nonfinite(res)
  return res


def generate(method, drafter, verifier, q_params, p_params, prompts=None, *,
             inputs=None, sampling=None, gamma: int = 5,
             max_new_tokens: int | Sequence[int] = 32, seeds=0,
             request_ids=None, eos_id: int | None | str = "auto",
             pad_id: int = 0, max_cache_length: int | None = None,
             on_nonfinite: str = "raise", mesh=None,
             pad_to: int | None = None,
             return_trace: bool = False, tree=None,
             tune=None) -> DecodeResult:
  """Decodes a batch with ``method`` (see ``registry.py``).

  A thin wrapper, kept for its signature: it is ``decoding.decode(
  Strategy(method, Chain(gamma) or tree, sampling), (drafter, verifier),
  (q_params, p_params), ...)`` (the one request path).

  Args:
    method: a method object (``make_method(name, **knobs)``).
    drafter: the small model q (DecodeModel); ignored by TargetOnly.
    verifier: the large model p (DecodeModel).
    q_params, p_params: their parameters.
    prompts: decoder-side prompts, a list of token lists (ragged) or a
      [B, P] array of integer ids; every row needs >= 1 token (e.g. BOS).
      For encoder-decoder models the default is the decoder start token.
    inputs: encoder inputs (encoder-decoder models only), ragged list or
      [B, S] array padded with 0.
    sampling: a sampling strategy (Greedy, Temperature, TopK, TopP); default
      greedy.
    gamma: draft block size, >= 1.
    max_new_tokens: int or per-row list, >= 0.
    seeds: int or per-row list of seeds in [0, 2**32).
    request_ids: per-row ids; by default each row's id is a hash of its
      own tokens (and of its occurrence among identical requests of the
      call, see ``inputs.default_request_ids``). The same (seed, request
      id) gives the same tokens in any batch, padding or mesh.
    eos_id: stop token; 'auto' uses the verifier's, None never stops early.
    pad_id: filler after the end of each row.
    max_cache_length: optional bound on cache slots; a request that needs
      more (prompt + max_new_tokens + gamma + 2) is rejected.
    on_nonfinite: 'raise' (default) raises on NaN/inf logits; 'return'
      returns the result with ``finite`` flags instead.
    mesh: optional ``jax.sharding.Mesh`` (``specdec_jax.sharding.make_mesh``):
      parameters, caches and batch rows are partitioned by the logical-axis
      rules; the batch is padded with inert rows to a multiple of the data
      axis. Results are identical to the single-device run.
    pad_to: optional minimum padded width of prompts and inputs. Rows are
      right-padded anyway (each keeps its own length, so padding never
      changes the output); a common width lets calls with differently long
      prompts share one compiled program.
    return_trace: also return per-block drafts, accept tests and emitted
      tokens (speculative methods; off by default, so the hot path is
      unchanged).
    tree: optional ``decoding.Tree`` (or a Topology): draft a token tree
      per block and verify it in ONE verifier step (docs/trees.md);
      ``gamma`` is then ignored (the tree's depth is the draft depth).
    tune: with ``method='auto'``: the auto table (or its path) whose row
      for this batch decides method, structure and sampling (``sampling``
      overrides the table's); see ``decode``.

  Returns:
    DecodeResult.
  """
  if isinstance(method, str) and method == "auto":
    return decode("auto", (drafter, verifier), (q_params, p_params), prompts,
                  inputs=inputs, max_new_tokens=max_new_tokens, seeds=seeds,
                  request_ids=request_ids, eos_id=eos_id, pad_id=pad_id,
                  max_cache_length=max_cache_length,
                  on_nonfinite=on_nonfinite, mesh=mesh, pad_to=pad_to,
                  return_trace=return_trace, tune=tune, sampling=sampling)
  strategy = Strategy(method, as_structure(gamma=gamma, tree=tree),
                      sampling)
  return decode(strategy, (drafter, verifier), (q_params, p_params), prompts,
                inputs=inputs, max_new_tokens=max_new_tokens, seeds=seeds,
                request_ids=request_ids, eos_id=eos_id, pad_id=pad_id,
                max_cache_length=max_cache_length,
                on_nonfinite=on_nonfinite, mesh=mesh, pad_to=pad_to,
                return_trace=return_trace)


__all__ = ["DecodeResult", "PAD_TO", "check_capacity", "check_memory",
           "decode", "generate", "raise_nonfinite", "result"]
