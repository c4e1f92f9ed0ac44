"""Host-side preparation of a decode call: checks, padding, the Batch.

Everything here runs on concrete (numpy) values before anything is traced,
so bad input gives a ``ValueError`` naming the problem, never an XLA crash
or silently wrong output. ``generate`` and the t5x Models share it.
"""

from __future__ import annotations

import hashlib

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.decoding import transfer
from specdec_jax.decoding.loops.state import Batch, Request
from specdec_jax.decoding.rules import knobs as knobs_lib
from specdec_jax.decoding.rules import sampling as sampling_lib
from specdec_jax.models.interface import check_decode_model, check_tokens

PAD_TO = 16
MAX_POSITIONS = 2**31 - 1


def pad_ragged(rows, width_multiple: int, what: str, pad: int = 0,
               min_width: int = 1):
  """list of token lists or a 2-D array -> ([B, W] int64, lengths [B]).

  W is the longest row (at least ``min_width``) rounded up to a multiple of
  ``width_multiple``. Token ids must be integers: a float id (``3.7``) or a
  string is an error, never truncated.
  """
  if isinstance(rows, (np.ndarray, jax.Array)):
    arr = np.asarray(rows)
    if arr.ndim != 2:
      raise ValueError(f"{what} must be a list of token lists or a [batch, "
                       f"length] array, got shape {arr.shape}")
    _check_integer(arr, what, None)
    lengths = np.full((arr.shape[0],), arr.shape[1], np.int32)
    rows = list(arr)
  else:
    if isinstance(rows, (str, bytes)):
      raise ValueError(f"{what} must be a list of token-id lists, got a "
                       f"string; tokenize the text first")
    for i, r in enumerate(rows):
      if isinstance(r, (str, bytes)):
        raise ValueError(f"{what} (row {i}) must be integer token ids, got "
                         f"the string {r!r}; tokenize the text first")
    rows = [list(r) for r in rows]
    for i, r in enumerate(rows):
      j = next((j for j, t in enumerate(r)
                if isinstance(t, (bool, np.bool_))), None)
      if j is not None:
        raise ValueError(f"{what} (row {i}) must be integer token ids, got "
                         f"the bool {r[j]!r} at position {j}; a bool is not "
                         f"a token id")
    rows = [np.asarray(r) for r in rows]
    for i, r in enumerate(rows):
      _check_integer(r, what, i)
    lengths = np.array([r.size for r in rows], np.int32)
  if not len(rows):
    raise ValueError(f"{what} is empty: pass at least one row")
  width = max(1, min_width, int(lengths.max()))
  width = -(-width // width_multiple) * width_multiple
  out = np.full((len(rows), width), pad, np.int64)
  for i, r in enumerate(rows):
    if r.size:
      out[i, :r.size] = r.astype(np.int64)
  return out, lengths


def _check_integer(arr: np.ndarray, what: str, row: int | None) -> None:
  where = f" (row {row})" if row is not None else ""
  if arr.size and arr.ndim != 1 and row is not None:
    raise ValueError(f"{what}{where} must be a flat list of token ids, got "
                     f"shape {arr.shape}")
  if arr.dtype == bool and arr.size:
    raise ValueError(f"{what}{where} must be integer token ids, got a bool "
                     f"array; a bool is not a token id")
  if arr.size and not np.issubdtype(arr.dtype, np.integer):
    bad = next((x for x in arr.ravel().tolist()
                if not float(x).is_integer()), arr.ravel()[0]) if \
        np.issubdtype(arr.dtype, np.floating) else arr.ravel()[0]
    raise ValueError(f"{what}{where} must be integer token ids, got "
                     f"{bad!r} ({arr.dtype}); ids are never rounded")


def default_request_ids(prompt: np.ndarray, plen: np.ndarray,
                        inputs: np.ndarray | None,
                        seeds: np.ndarray) -> np.ndarray:
  """Per-row ids derived from the request itself (stable across batches).

  The id of a row is a 31-bit BLAKE2b hash of its prompt tokens
  ``prompt[:len]``, its encoder input without trailing padding, and its
  occurrence k among the rows of this call with the same tokens and seed
  (0 for the first). So the same request with the same seed gives the same
  tokens in any row of any batch, with no ids passed, while k identical
  requests in one call are k independent samples (the same k samples in
  any batch that holds them).

  Args:
    prompt: [B, P] int ids; plen: [B] lengths.
    inputs: [B, S] encoder ids (0 = padding) or None.
    seeds: [B] seeds.

  Returns:
    [B] int64 ids in [0, 2**31).
  """
  ids, seen = [], {}
  for b in range(prompt.shape[0]):
    h = hashlib.blake2b(digest_size=8)
    h.update(np.asarray(prompt[b, :plen[b]], "<i8").tobytes())
    if inputs is not None:
      row = np.asarray(inputs[b], "<i8")
      nz = np.nonzero(row)[0]
      h.update(b"|" + row[:nz[-1] + 1 if nz.size else 0].tobytes())
    key = (h.digest(), int(seeds[b]))
    k = seen.get(key, 0)
    seen[key] = k + 1
    h.update(b"#" + k.to_bytes(8, "little"))
    ids.append(int.from_bytes(h.digest(), "little") & 0x7FFFFFFF)
  return np.asarray(ids, np.int64)


def check_seeds(seeds, batch: int) -> np.ndarray:
  """[B] uint32 seeds; ValueError for non-integers or values outside
  [0, 2**32)."""
  arr = np.asarray(seeds)
  if arr.size and not np.issubdtype(arr.dtype, np.integer):
    raise ValueError(f"seeds must be integers in [0, 2**32), got "
                     f"{arr.tolist()}")
  if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= 2**32):
    raise ValueError(f"seeds must be integers in [0, 2**32), got "
                     f"{arr.tolist()}; negative seeds are not wrapped")
  try:
    return np.broadcast_to(arr, (batch,)).astype(np.uint32)
  except ValueError:
    raise ValueError(f"seeds must be one int or one per row ({batch}), got "
                     f"shape {arr.shape}; cannot broadcast") from None


def check_max_new(max_new_tokens, batch: int) -> np.ndarray:
  """[B] int64 budgets; ValueError unless integers in [0, 2**31)."""
  arr = np.asarray(max_new_tokens)
  if (not np.issubdtype(arr.dtype, np.integer)) or (
      arr.size and int(arr.min()) < 0):
    raise ValueError(f"max_new_tokens must be integers >= 0, got "
                     f"{arr.tolist()}")
  if arr.size and int(arr.max()) >= MAX_POSITIONS:
    raise ValueError(f"max_new_tokens {int(arr.max())} is too large: cache "
                     f"positions are int32 (< 2**31); ask for fewer tokens")
  return np.broadcast_to(arr, (batch,)).astype(np.int64)


def check_models(method, drafter, verifier) -> None:
  """The models follow the decode protocol and fit together."""
  check_decode_model(verifier, "verifier")
  if not method.uses_drafter:
    return
  check_decode_model(drafter, "drafter")
  if drafter.vocab_size != verifier.vocab_size:
    raise ValueError(
        f"drafter and verifier vocabularies differ ({drafter.vocab_size} vs "
        f"{verifier.vocab_size} ids): speculative decoding compares their "
        f"distributions token by token, so both must use the same tokenizer "
        f"and embedding size")
  if drafter.is_encoder_decoder != verifier.is_encoder_decoder:
    raise ValueError("drafter and verifier must both be encoder-decoder or "
                     "both decoder-only models")


def describe_model(model) -> str:
  """``GemmaModel (64 ids, 2 decoder layers, 41,216 parameters)``."""
  parts = [f"{model.vocab_size} ids"]
  layers = getattr(model, "num_decoder_layers", None)
  if layers is not None:
    parts.append(f"{layers} decoder layers")
  if hasattr(model, "num_params"):
    parts.append(f"{model.num_params():,} parameters")
  return f"{type(model).__name__} ({', '.join(parts)})"


def check_params(method, drafter, verifier, q_params, p_params) -> None:
  """Each parameter tree fits its model (names, shapes), checked on shapes
  before anything runs, so the wrong model's params are an error naming the
  model, not a Flax scope error from inside a trace."""
  pairs = [("verifier", verifier, p_params)]
  if method.uses_drafter:
    pairs.append(("drafter", drafter, q_params))
  for role, model, params in pairs:
    transfer.warn_host_params(role, params)
    if not hasattr(model, "check_params"):
      continue  # a user model following only the decode protocol
    try:
      model.check_params(params)
    except ValueError as e:
      raise ValueError(f"the {role}'s params do not fit the {role} model "
                       f"{describe_model(model)}: {e}; pass the params loaded "
                       f"with this model (checkpoints.load returns both)"
                       ) from None


def check_method(method, strategy) -> None:
  """Method and sampling are valid objects with valid knobs, and fit."""
  if not (hasattr(method, "program") and hasattr(method, "knobs")):
    raise ValueError(f"method must be a decoding method object (see "
                     f"decoding.make_method), got {type(method).__name__}")
  if not hasattr(strategy, "probs"):
    raise ValueError(f"sampling must be a strategy (Greedy, Temperature, "
                     f"TopK, TopP), got {type(strategy).__name__}")
  strategy.validate()
  method.validate()
  if method.greedy_only and not sampling_lib.is_greedy(strategy):
    name = type(getattr(method, "target", method)).__name__
    raise ValueError(f"{name} is a greedy method; use sampling=Greedy() or "
                     f"temperature 0 (for sampling, TokenV3 generalises "
                     f"LossyGreedy)")


def make_batch(prompt, prompt_len, inputs, req: Request, strategy,
               method) -> Batch:
  """The Batch of a call: arrays plus per-row [B] knob dicts."""
  b = prompt.shape[0]
  _, sampling_knobs = knobs_lib.split(sampling_lib.canonical(strategy))
  ids = lambda x: (x.astype(jnp.int32) if isinstance(x, jax.Array) else
                   np.asarray(x, np.int32))
  return transfer.to_device(Batch(
      prompt=ids(prompt), prompt_len=ids(prompt_len),
      inputs=None if inputs is None else ids(inputs),
      req=req, sampling=knobs_lib.per_row(sampling_knobs, b, "sampling"),
      knobs=knobs_lib.per_row(method.knobs(), b, "method")))


def sampling_static(strategy) -> knobs_lib.Static:
  """The static half of a sampling strategy (part of the LoopConfig)."""
  return knobs_lib.split(sampling_lib.canonical(strategy))[0]


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


def check_prompts(prompt: np.ndarray, plen: np.ndarray, inputs, vocab: int):
  """Every row has a token; every id is inside the vocabulary."""
  if int(plen.min()) < 1:
    row = int(plen.argmin())
    raise ValueError(f"prompt of row {row} is empty; every row needs at least "
                     f"one token (BOS / decoder start)")
  check_tokens(prompt, vocab, "prompts")
  if inputs is not None:
    check_tokens(inputs, vocab, "inputs")


def prompts_and_inputs(verifier, prompts, inputs, pad_to: int | None):
  """Padded decoder prompts, lengths and encoder inputs of a call.

  Returns:
    (prompt [B, P] int64, prompt_len [B], inputs [B, S] or None).
  """
  if pad_to is not None and (
      isinstance(pad_to, bool) or not isinstance(pad_to, (int, np.integer))
      or not 1 <= pad_to < MAX_POSITIONS):
    raise ValueError(f"pad_to must be None or an integer >= 1 (the minimum "
                     f"padded prompt width), got {pad_to!r}")
  encdec = verifier.is_encoder_decoder
  inp = None
  if encdec:
    if inputs is None:
      raise ValueError("encoder-decoder models need inputs= (the source "
                       "token ids)")
    inp, _ = pad_ragged(inputs, PAD_TO, "inputs", min_width=pad_to or 1)
    if prompts is None:
      start = getattr(verifier.config, "decoder_start_id", 0)
      prompts = [[start]] * inp.shape[0]
  else:
    if inputs is not None:
      raise ValueError("decoder-only models take no inputs=; put the text in "
                       "prompts=")
    if prompts is None:
      raise ValueError("prompts= is required for decoder-only models")
  prompt, plen = pad_ragged(prompts, PAD_TO, "prompts",
                            min_width=1 if encdec else (pad_to or 1))
  if inp is not None and inp.shape[0] != prompt.shape[0]:
    raise ValueError(f"inputs have {inp.shape[0]} rows but prompts have "
                     f"{prompt.shape[0]}")
  check_prompts(prompt, plen, inp, verifier.vocab_size)
  return prompt, plen, inp


def request_ids_of(ids, prompt, plen, inp, seeds) -> np.ndarray:
  """[B] int32 request ids: given, or derived from each request."""
  batch = prompt.shape[0]
  if ids is None:
    return default_request_ids(prompt, plen, inp, seeds).astype(np.int32)
  arr = np.asarray(ids)
  if arr.shape != (batch,):
    raise ValueError(f"request_ids must have one id per row ({batch}), got "
                     f"shape {arr.shape}")
  if not np.issubdtype(arr.dtype, np.integer):
    raise ValueError(f"request_ids must be integers, got {arr.tolist()}")
  if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= 2**31):
    bad = next(int(x) for x in arr.tolist() if not 0 <= x < 2**31)
    raise ValueError(f"request_ids must be integers in [0, 2**31), got {bad}"
                     f"; ids are never wrapped (hash a larger id into the "
                     f"range, e.g. eval.harness.request_id)")
  return arr.astype(np.int32)


def check_special_ids(eos_id, pad_id, vocab: int) -> None:
  """``eos_id`` (None: never stop) and ``pad_id`` are ids in [0, vocab)."""
  for name, value, optional in (("eos_id", eos_id, True),
                                ("pad_id", pad_id, False)):
    if value is None and optional:
      continue
    if (isinstance(value, bool) or not isinstance(value, (int, np.integer))
        or not 0 <= value < vocab):
      none = " or None (never stop early)" if optional else ""
      raise ValueError(f"{name} must be a token id in [0, {vocab}) (the "
                       f"verifier's vocabulary){none}, got {value!r}")


def prepare_batch(method, verifier, strategy, *, prompts, inputs,
                  max_new_tokens, seeds, request_ids, pad_to, mesh):
  """The checked, padded Batch of a call (shared by every entry point).

  Returns:
    (batch: Batch of device arrays (padded with inert rows for ``mesh``),
    rows: the number of real rows, max_new: the output buffer size,
    prompt_width: the padded prompt width).
  """
  prompt, plen, inp = prompts_and_inputs(verifier, prompts, inputs, pad_to)
  rows = prompt.shape[0]
  max_new = check_max_new(max_new_tokens, rows)
  seeds = check_seeds(seeds, rows)
  req = Request(seed=seeds,  # host arrays: make_batch puts them
                request_id=request_ids_of(request_ids, prompt, plen, inp,
                                          seeds),
                max_new_tokens=max_new.astype(np.int32))
  batch = make_batch(prompt, plen, inp, req, strategy, method)
  if mesh is not None:
    batch = pad_batch(batch, data_parallelism(mesh))
  return batch, rows, max(1, int(max_new.max())), prompt.shape[1]
