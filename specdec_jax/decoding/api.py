"""Public entry point: ``generate`` and its result.

    from specdec_jax import decoding, models
    drafter, verifier = models.get_model(...), models.get_model(...)
    out = decoding.generate(
        decoding.make_method("token_v3", alpha=0.3), drafter, verifier,
        q_params, p_params, prompts=[[2, 17, 5], [2, 9]],
        sampling=decoding.TopP(p=0.9, temperature=0.5), gamma=5,
        max_new_tokens=64, seeds=0)
    out.sequences(), out.acceptance_rate, out.block_efficiency

Inputs are checked on the host before anything is traced, so bad input gives
a ``ValueError`` naming the problem, never an XLA crash. Prompt widths are
padded to a multiple of ``PAD_TO`` so new prompts reuse compiled programs;
knobs (alpha, beta, temperature, top-p, seeds) are traced and never recompile.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.decoding import sampling as sampling_lib
from specdec_jax.decoding.speculative import LoopConfig, capacity
from specdec_jax.decoding.state import Batch, Request
from specdec_jax.models.interface import check_tokens

PAD_TO = 16


@dataclasses.dataclass
class DecodeResult:
  """Host-side result of :func:`generate`.

  Attributes:
    tokens: [B, max_new_tokens] int32 generated ids, ``pad_id`` after the end
      (an EOS, when hit, is included).
    lengths: [B] number of generated tokens.
    drafted, accepted, verifier_calls, drafter_calls: [B] int counters.
    deferrals: [B] float summed deferral mass.
    finite: [B] bool, False where a NaN/inf logit was met.
  """

  tokens: np.ndarray
  lengths: np.ndarray
  drafted: np.ndarray
  accepted: np.ndarray
  verifier_calls: np.ndarray
  drafter_calls: np.ndarray
  deferrals: np.ndarray
  finite: np.ndarray

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


def _pad_ragged(rows, width_multiple: int, what: str, pad: int = 0,
                min_width: int = 1):
  """list of token lists or a 2-D array -> ([B, W] int32, lengths [B]).

  W is the longest row (at least ``min_width``) rounded up to a multiple of
  ``width_multiple``.
  """
  if isinstance(rows, (np.ndarray, jax.Array)):
    arr = np.asarray(rows)
    if arr.ndim != 2:
      raise ValueError(f"{what} must be a list of token lists or a [batch, "
                       f"length] array, got shape {arr.shape}")
    lengths = np.full((arr.shape[0],), arr.shape[1], np.int32)
    rows = [list(r) for r in arr]
  else:
    rows = [list(r) for r in rows]
    lengths = np.array([len(r) for r in rows], np.int32)
  if not rows:
    raise ValueError(f"{what} is empty: pass at least one row")
  width = max(1, min_width, int(lengths.max()))
  width = -(-width // width_multiple) * width_multiple
  out = np.full((len(rows), width), pad, np.int64)
  for i, r in enumerate(rows):
    if r:
      out[i, :len(r)] = np.asarray(r, np.int64)
  return out, lengths


# Knobs that are integers; every other knob is float32.
_INT_KNOBS = ("k",)


def per_row_tree(tree, batch: int, what: str):
  """Broadcasts every knob leaf of a pytree to a canonical [batch] array.

  Canonical dtypes (float32, int32 for top-k; never weakly typed) make knob
  values of any Python or numpy type hit the same compiled program.
  """

  def fix(path, x):
    name = getattr(path[-1], "name", None) if path else None
    dtype = jnp.int32 if name in _INT_KNOBS else jnp.float32
    arr = jnp.asarray(np.asarray(x), dtype)
    if arr.ndim == 0:
      return jnp.broadcast_to(arr, (batch,))
    if arr.shape != (batch,):
      raise ValueError(f"{what} knob '{name}' has shape {arr.shape}; use a "
                       f"scalar or one value per row, shape ({batch},)")
    return arr

  # A list / tuple knob ([0.1, 0.5]) is one per-row value, not a subtree.
  is_knob = lambda x: isinstance(x, (list, tuple)) and all(
      isinstance(e, (int, float, np.number)) for e in x)
  return jax.tree_util.tree_map_with_path(fix, tree, is_leaf=is_knob)


def data_parallelism(mesh) -> int:
  """Number of batch shards of ``mesh`` (its 'data' axis size)."""
  return int(dict(mesh.shape).get("data", 1))


def pad_batch(batch: Batch, multiple: int) -> Batch:
  """Pads the rows of ``batch`` to a multiple of ``multiple``.

  Padding rows are inert copies of row 0 with ``max_new_tokens = 0``: they
  are finished before the first step, and their knobs are valid values (a
  padded temperature of -1 would flip logits, a classic sharding bug).
  """
  b = batch.prompt.shape[0]
  extra = -b % multiple
  if not extra:
    return batch
  pad = lambda x: jnp.concatenate(
      [x, jnp.broadcast_to(x[:1], (extra,) + x.shape[1:])], axis=0)
  padded = jax.tree.map(pad, batch)
  mnt = padded.req.max_new_tokens.at[b:].set(0)
  ids = padded.req.request_id.at[b:].set(-1)
  return padded.replace(req=padded.req.replace(max_new_tokens=mnt,
                                               request_id=ids))


def gather(x):
  """A (possibly multi-host sharded) array as one host numpy array."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    return multihost_utils.process_allgather(x, tiled=True)
  return jax.device_get(x)


def check_vocab(drafter, verifier) -> None:
  if drafter.vocab_size != verifier.vocab_size:
    raise ValueError(
        f"drafter and verifier vocabularies differ ({drafter.vocab_size} vs "
        f"{verifier.vocab_size} ids): speculative decoding compares their "
        f"distributions token by token, so both must use the same tokenizer "
        f"and embedding size")
  if drafter.is_encoder_decoder != verifier.is_encoder_decoder:
    raise ValueError("drafter and verifier must both be encoder-decoder or "
                     "both decoder-only models")


def is_greedy(strategy) -> bool:
  if isinstance(strategy, sampling_lib.Greedy):
    return True
  t = getattr(strategy, "temperature", None)
  return t is not None and bool(jnp.all(jnp.asarray(t) == 0))


def generate(method, drafter, verifier, q_params, p_params, prompts=None, *,
             inputs=None, sampling=None, gamma: int = 5,
             max_new_tokens: int | Sequence[int] = 32, seeds=0,
             request_ids=None, eos_id: int | None | str = "auto",
             pad_id: int = 0, max_cache_length: int | None = None,
             on_nonfinite: str = "raise", mesh=None,
             pad_to: int | None = None) -> DecodeResult:
  """Decodes a batch with ``method`` (see ``methods.py``).

  Args:
    method: a method object (``make_method(name, **knobs)``).
    drafter: the small model q (DecodeModel); ignored by TargetOnly.
    verifier: the large model p (DecodeModel).
    q_params, p_params: their parameters.
    prompts: decoder-side prompts, a list of token lists (ragged) or a
      [B, P] array; every row needs >= 1 token (e.g. BOS). For
      encoder-decoder models the default is the decoder start token alone.
    inputs: encoder inputs (encoder-decoder models only), ragged list or
      [B, S] array padded with 0.
    sampling: a sampling strategy (Greedy, Temperature, TopK, TopP); default
      greedy.
    gamma: draft block size, >= 1.
    max_new_tokens: int or per-row list, >= 0.
    seeds: int or per-row list of seeds.
    request_ids: per-row ids (default 0..B-1). The same (seed, request id,
      prompt) gives the same tokens in any batch.
    eos_id: stop token; 'auto' uses the verifier's, None never stops early.
    pad_id: filler after the end of each row.
    max_cache_length: optional bound on cache slots; a request that needs
      more (prompt + max_new_tokens + gamma + 2) is rejected.
    on_nonfinite: 'raise' (default) raises on NaN/inf logits; 'return'
      returns the result with ``finite`` flags instead.
    pad_to: optional minimum padded width of prompts and inputs. Rows are
      right-padded anyway (each keeps its own length, so padding never
      changes the output); a common width lets calls with differently long
      prompts share one compiled program.
    mesh: optional ``jax.sharding.Mesh`` (``specdec_jax.sharding.make_mesh``):
      parameters, caches and batch rows are partitioned by the logical-axis
      rules; the batch is padded with inert rows to a multiple of the data
      axis. Results are identical to the single-device run.

  Returns:
    DecodeResult.
  """
  if isinstance(gamma, bool) or not isinstance(gamma, (int, np.integer)) or (
      gamma < 1):
    raise ValueError(f"gamma must be an integer >= 1, got {gamma!r}")
  if on_nonfinite not in ("raise", "return"):
    raise ValueError(f"on_nonfinite must be 'raise' or 'return', got "
                     f"{on_nonfinite!r}")
  if not hasattr(method, "run"):
    raise ValueError(f"method must be a decoding method object (see "
                     f"decoding.make_method), got {type(method).__name__}")
  if method.uses_drafter:
    check_vocab(drafter, verifier)
  encdec = verifier.is_encoder_decoder

  if encdec:
    if inputs is None:
      raise ValueError("encoder-decoder models need inputs= (the source "
                       "token ids)")
    inp, _ = _pad_ragged(inputs, PAD_TO, "inputs", min_width=pad_to or 1)
    batch = inp.shape[0]
    if prompts is None:
      start = getattr(verifier.config, "decoder_start_id", 0)
      prompts = [[start]] * batch
  else:
    if inputs is not None:
      raise ValueError("decoder-only models take no inputs=; put the text in "
                       "prompts=")
    if prompts is None:
      raise ValueError("prompts= is required for decoder-only models")
    inp = None
  prompt, plen = _pad_ragged(
      prompts, PAD_TO, "prompts",
      min_width=1 if encdec else (pad_to or 1))
  batch = prompt.shape[0]
  if inp is not None and inp.shape[0] != batch:
    raise ValueError(f"inputs have {inp.shape[0]} rows but prompts have "
                     f"{batch}")
  if int(plen.min()) < 1:
    row = int(plen.argmin())
    raise ValueError(f"prompt of row {row} is empty; every row needs at least "
                     f"one token (BOS / decoder start)")
  vocab = verifier.vocab_size
  check_tokens(prompt, vocab, "prompts")
  if inp is not None:
    check_tokens(inp, vocab, "inputs")

  max_new = np.broadcast_to(np.asarray(max_new_tokens), (batch,))
  if not np.issubdtype(max_new.dtype, np.integer) or int(max_new.min()) < 0:
    raise ValueError(f"max_new_tokens must be integers >= 0, got "
                     f"{np.asarray(max_new_tokens).tolist()}")
  buf = max(1, int(max_new.max()))
  if eos_id == "auto":
    eos_id = getattr(verifier, "eos_id", None)
  cfg = LoopConfig(gamma=int(gamma), max_new=buf, eos_id=eos_id,
                   pad_id=pad_id)
  need = capacity(prompt.shape[1], cfg)
  if max_cache_length is not None and need > max_cache_length:
    raise ValueError(
        f"prompt ({prompt.shape[1]} padded) + max_new_tokens ({buf}) + gamma "
        f"+ 2 = {need} cache slots exceed max_cache_length "
        f"({max_cache_length}); shorten the prompt or max_new_tokens")

  strategy = sampling_lib.Greedy() if sampling is None else sampling
  if not hasattr(strategy, "probs"):
    raise ValueError(f"sampling must be a strategy (Greedy, Temperature, TopK, "
                     f"TopP), got {type(strategy).__name__}")
  strategy.validate()
  method.validate()
  if method.greedy_only and not is_greedy(strategy):
    name = type(getattr(method, "target", method)).__name__
    raise ValueError(f"{name} is a greedy method; use "
                     f"sampling=Greedy() or temperature 0 (for sampling, "
                     f"TokenV3 generalises LossyGreedy)")
  strategy = per_row_tree(strategy, batch, "sampling")
  method = per_row_tree(method, batch, "method")

  ids = np.arange(batch) if request_ids is None else np.asarray(request_ids)
  seeds = np.broadcast_to(np.asarray(seeds), (batch,))
  if ids.shape != (batch,):
    raise ValueError(f"request_ids must have one id per row ({batch}), got "
                     f"shape {ids.shape}")
  req = Request(seed=jnp.asarray(seeds.astype(np.uint32)),
                request_id=jnp.asarray(ids.astype(np.int32)),
                max_new_tokens=jnp.asarray(max_new.astype(np.int32)))
  batch_in = Batch(prompt=jnp.asarray(prompt, jnp.int32),
                   prompt_len=jnp.asarray(plen),
                   inputs=None if inp is None else jnp.asarray(inp, jnp.int32),
                   req=req, strategy=strategy, method=method)
  if mesh is not None:
    batch_in = pad_batch(batch_in, data_parallelism(mesh))
  out = batch_in.method.run(drafter, verifier, q_params, p_params, batch_in,
                            cfg, mesh)
  out = jax.tree.map(lambda x: np.asarray(gather(x))[:batch], out)
  res = DecodeResult(
      tokens=out.tokens[:, :buf], lengths=out.num_out,
      drafted=np.asarray(out.stats.drafted),
      accepted=np.asarray(out.stats.accepted),
      verifier_calls=np.asarray(out.stats.verifier_calls),
      drafter_calls=np.asarray(out.stats.drafter_calls),
      deferrals=np.asarray(out.stats.deferrals),
      finite=np.asarray(out.finite))
  if on_nonfinite == "raise" and not res.finite.all():
    rows = np.nonzero(~res.finite)[0].tolist()
    raise FloatingPointError(
        f"non-finite logits (NaN/inf) from the drafter or verifier in rows "
        f"{rows}; the parameters are corrupt or overflow in this dtype "
        f"(try float32); pass on_nonfinite='return' to get partial output")
  return res
