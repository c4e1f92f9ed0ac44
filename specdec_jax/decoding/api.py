"""Public entry point: ``generate`` and its result.

    from specdec_jax import decoding, models
    drafter, verifier = models.get_model(...), models.get_model(...)
    out = decoding.generate(
        decoding.make_method("token_v3", alpha=0.3), drafter, verifier,
        q_params, p_params, prompts=[[2, 17, 5], [2, 9]],
        sampling=decoding.TopP(p=0.9, temperature=0.5), gamma=5,
        max_new_tokens=64, seeds=0)
    out.sequences(), out.acceptance_rate, out.block_efficiency

The decode path of a call: inputs are checked and padded on the host
(``inputs.py``) into a :class:`Batch` (arrays and per-row knob dicts) and a
static :class:`LoopConfig`; the method RETURNS its loop program
(``method.program(models, cfg)``, ``methods.py``); ``run_program`` compiles
it once per key and runs it (``loops/program.py``). Prompt widths are padded
to a multiple of ``PAD_TO`` so new prompts reuse compiled programs; knobs
(alpha, beta, temperature, top-p, seeds) are traced and never recompile.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import numpy as np

from specdec_jax.decoding.budget import check_capacity, check_memory
from specdec_jax.decoding import inputs as inputs_lib
from specdec_jax.decoding.loops import tree as tree_loop
from specdec_jax.decoding.loops.program import run_program
from specdec_jax.decoding.loops.state import LoopConfig, Request
from specdec_jax.decoding.rules import sampling as sampling_lib
from specdec_jax.decoding.verify.topology import Topology

PAD_TO = inputs_lib.PAD_TO


@dataclasses.dataclass
class DecodeResult:
  """Host-side result of :func:`generate`.

  Attributes:
    tokens: [B, max_new_tokens] int32 generated ids, ``pad_id`` after the end
      (an EOS, when hit, is included).
    lengths: [B] number of generated tokens.
    drafted, accepted: [B] draft tokens proposed to / accepted by the
      verifier (the top level).
    verifier_calls: [B] calls of the verifier (the top level).
    drafter_calls: [B] calls of every model below it.
    deferrals: [B] float summed deferral mass.
    finite: [B] bool, False where a NaN/inf logit was met.
    calls, level_drafted, level_accepted, level_rejected: [B, K] the same
      counters per level of the stack (cheapest first; K = 2 for a
      drafter/verifier pair); ``level_rejected`` counts the verification
      rounds that ended with a rejection.
    trace: per-block trace (``return_trace=True``), else None: a dict of
      ``drafts`` [B, blocks, gamma], ``accept`` [B, blocks, gamma] bool (the
      accept test of every draft), ``accepted`` [B, blocks] (leading drafts
      kept; -1 where the row ran no such block) and ``token`` [B, blocks]
      (the residual or bonus token emitted after them).
  """

  tokens: np.ndarray
  lengths: np.ndarray
  drafted: np.ndarray
  accepted: np.ndarray
  verifier_calls: np.ndarray
  drafter_calls: np.ndarray
  deferrals: np.ndarray
  finite: np.ndarray
  calls: np.ndarray | None = None
  level_drafted: np.ndarray | None = None
  level_accepted: np.ndarray | None = None
  level_rejected: np.ndarray | None = None
  trace: dict | None = None

  def sequences(self) -> list[list[int]]:
    """Generated tokens of each row, without padding."""
    return [list(map(int, t[:n])) for t, n in zip(self.tokens, self.lengths)]

  @property
  def acceptance_rate(self) -> float:
    """Accepted drafts / drafted tokens, over the batch (nan if no drafts)."""
    d = self.drafted.sum()
    return float(self.accepted.sum() / d) if d else float("nan")

  @property
  def block_efficiency(self) -> float:
    """Generated tokens per verifier call, over the batch."""
    c = self.verifier_calls.sum()
    return float(self.lengths.sum() / c) if c else float("nan")

  @property
  def mean_accepted_length(self) -> np.ndarray:
    """[B] tokens per verifier call of each row."""
    return self.lengths / np.maximum(self.verifier_calls, 1)

  @property
  def deferral_rate(self) -> float:
    """Deferral mass per generated token, over the batch."""
    n = self.lengths.sum()
    return float(self.deferrals.sum() / n) if n else float("nan")

  def level_acceptance(self) -> list[float]:
    """Acceptance rate (accepted / drafted tokens) of each level over the
    level below (level 0: nan)."""
    d, a = self.level_drafted.sum(0), self.level_accepted.sum(0)
    return [float(x / y) if y else float("nan") for x, y in zip(a, d)]

  def level_alpha(self) -> list[float]:
    """Measured alpha of each adjacent pair (level 0: nan): the fraction
    of accept tests passed, accepted / (accepted + rejections); for
    i.i.d. acceptance this estimates E[sum_v min(q, p)]."""
    a, r = self.level_accepted.sum(0), self.level_rejected.sum(0)
    return [float(x / (x + y)) if x + y else float("nan")
            for x, y in zip(a, r)]

  def summary(self) -> dict[str, float]:
    """Aggregates as a flat dict (for JSONL / tables)."""
    return dict(tokens=int(self.lengths.sum()),
                acceptance_rate=self.acceptance_rate,
                block_efficiency=self.block_efficiency,
                deferral_rate=self.deferral_rate,
                verifier_calls=int(self.verifier_calls.sum()),
                drafter_calls=int(self.drafter_calls.sum()))

  def row_stats(self, i: int) -> dict[str, Any]:
    """Per-row statistics of row ``i``."""
    return dict(tokens=int(self.lengths[i]), drafted=int(self.drafted[i]),
                accepted=int(self.accepted[i]),
                verifier_calls=int(self.verifier_calls[i]),
                drafter_calls=int(self.drafter_calls[i]),
                deferrals=float(self.deferrals[i]),
                mean_accepted_length=float(self.mean_accepted_length[i]))


def result(out, batch: int, width: int) -> DecodeResult:
  """DecodeResult of a LoopOutput (device arrays) for the first ``batch``
  rows (the rest is mesh padding)."""
  out = jax.tree.map(lambda x: np.asarray(inputs_lib.gather(x))[:batch], out)
  stack = lambda f: np.stack([getattr(lv, f) for lv in out.levels], axis=1)
  calls = stack("calls")  # [B, K]
  trace = None
  if out.trace is not None:
    blocks = max(1, int(out.levels[-1].calls.max()))
    trace = {f.name: getattr(out.trace, f.name)[:, :blocks]
             for f in dataclasses.fields(out.trace)}
  return DecodeResult(
      tokens=out.tokens[:, :width], lengths=out.num_out,
      drafted=out.levels[-1].drafted, accepted=out.levels[-1].accepted,
      verifier_calls=calls[:, -1], drafter_calls=calls[:, :-1].sum(1),
      deferrals=out.deferrals, finite=out.finite, calls=calls,
      level_drafted=stack("drafted"), level_accepted=stack("accepted"),
      level_rejected=stack("rejected"), trace=trace)


def raise_nonfinite(res: DecodeResult) -> None:
  """FloatingPointError naming the rows that met NaN/inf logits, if any."""
  if res.finite.all():
    return
  rows = np.nonzero(~res.finite)[0].tolist()
  raise FloatingPointError(
      f"non-finite logits (NaN/inf) from the drafter or verifier in rows "
      f"{rows}; the parameters are corrupt or overflow in this dtype "
      f"(try float32); pass on_nonfinite='return' to get partial output")


def generate(method, drafter, verifier, q_params, p_params, prompts=None, *,
             inputs=None, sampling=None, gamma: int = 5,
             max_new_tokens: int | Sequence[int] = 32, seeds=0,
             request_ids=None, eos_id: int | None | str = "auto",
             pad_id: int = 0, max_cache_length: int | None = None,
             on_nonfinite: str = "raise", mesh=None,
             pad_to: int | None = None,
             return_trace: bool = False, tree=None) -> DecodeResult:
  """Decodes a batch with ``method`` (see ``registry.py``).

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

  Returns:
    DecodeResult.
  """
  if on_nonfinite not in ("raise", "return"):
    raise ValueError(f"on_nonfinite must be 'raise' or 'return', got "
                     f"{on_nonfinite!r}")
  topology = Topology.chain(gamma)
  strategy = sampling_lib.Greedy() if sampling is None else sampling
  inputs_lib.check_method(method, strategy)
  if return_trace and not getattr(method, "traces", False):
    raise ValueError(f"return_trace=True records draft blocks; "
                     f"{type(method).__name__} drafts none (use a "
                     f"speculative method)")
  inputs_lib.check_models(method, drafter, verifier)
  inputs_lib.check_params(method, drafter, verifier, q_params, p_params)
  prompt, plen, inp = inputs_lib.prompts_and_inputs(verifier, prompts,
                                                    inputs, pad_to)
  batch = prompt.shape[0]
  max_new = inputs_lib.check_max_new(max_new_tokens, batch)
  buf = max(1, int(max_new.max()))
  if eos_id == "auto":
    eos_id = getattr(verifier, "eos_id", None)
  inputs_lib.check_special_ids(eos_id, pad_id, verifier.vocab_size)
  loop_fields = dict(max_new=buf, eos_id=eos_id, pad_id=pad_id,
                     sampling=inputs_lib.sampling_static(strategy),
                     trace=bool(return_trace))
  if tree is not None:
    cfg = tree_loop.make_config(tree, method, verifier.vocab_size,
                                **loop_fields)
  else:
    cfg = LoopConfig(topology=topology, **loop_fields)
  check_capacity(prompt.shape[1], buf, cfg, tree is not None,
                 max_cache_length)
  seeds = inputs_lib.check_seeds(seeds, batch)
  req = Request(
      seed=seeds, request_id=inputs_lib.request_ids_of(request_ids, prompt,
                                                    plen, inp, seeds),
      max_new_tokens=np.asarray(max_new.astype(np.int32)))
  batch_in = inputs_lib.make_batch(prompt, plen, inp, jax.tree.map(
      jax.numpy.asarray, req), strategy, method)
  if tree is not None:
    batch_in = tree_loop.add_tree(batch_in, cfg.topology)
  if mesh is not None:
    batch_in = inputs_lib.pad_batch(batch_in,
                                    inputs_lib.data_parallelism(mesh))
  models = (drafter, verifier)
  program = method.program(models, cfg)
  args = ((q_params, p_params), batch_in)
  check_memory(program, args, mesh)
  res = result(run_program(program, args, mesh), batch, buf)
  if on_nonfinite == "raise":
    raise_nonfinite(res)
  return res
