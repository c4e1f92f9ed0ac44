"""Machinery shared by the speculative t5x Models (see ``models.py``).

The Model classes in ``models.py`` differ only in how they read t5x's
features; this module holds what they share: construction checks, the
``params_axes`` collection, per-request ids, running the decode loop inside
t5x's trace, ranking ``num_decodes`` samples and t5x's scoring arithmetic.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import flax
import jax
import jax.numpy as jnp
import numpy as np
from flax.linen import partitioning as flax_partitioning

from specdec_jax import models as models_lib
from specdec_jax.models import families
from specdec_jax import sharding
from specdec_jax.decoding import inputs as inputs_lib
from specdec_jax.decoding import registry
from specdec_jax.decoding.loops.state import Request
from specdec_jax.decoding.rules import sampling as sampling_lib
from specdec_jax.decoding.verify.topology import Topology
from specdec_jax.t5x import drafting

_DECODER_PARAMS = ("decode_rng", "eos_id", "max_decode_steps")


def _fmix32(h: jax.Array) -> jax.Array:
  """MurmurHash3 finaliser on uint32 (wrapping arithmetic)."""
  h = h ^ (h >> 16)
  h = h * jnp.uint32(0x85EBCA6B)
  h = h ^ (h >> 13)
  h = h * jnp.uint32(0xC2B2AE35)
  return h ^ (h >> 16)


def hash_rows(tokens: jax.Array) -> jax.Array:
  """31-bit hash of each row's non-zero tokens and their positions.

  Trailing padding does not change it, so the same example hashes the same
  under any feature length.

  Args:
    tokens: [B, T] integer ids (0 = padding).

  Returns:
    [B] int32 in [0, 2**31).
  """
  tok = tokens.astype(jnp.uint32)
  pos = jnp.arange(tokens.shape[1], dtype=jnp.uint32)[None, :]
  mixed = _fmix32(tok * jnp.uint32(0x9E3779B1) + _fmix32(pos + 1))  # [B, T]
  mixed = jnp.where(tokens != 0, mixed, jnp.uint32(0))
  total = jnp.sum(mixed, axis=1, dtype=jnp.uint32)  # wraps mod 2**32
  return (_fmix32(total) & jnp.uint32(0x7FFFFFFF)).astype(jnp.int32)


def _resolve_model(model, overrides: Mapping[str, Any] | None, what: str):
  """A DecodeModel from a model object, a preset name or a config.

  ``overrides`` (config fields such as ``{'dtype': 'float32'}``, the gin
  file's COMPUTE_DTYPE) apply to all three forms: a config (e.g. a custom
  size built with ``@specdec_jax.models.T5Config()`` in gin) and a T5Model /
  GemmaModel are rebuilt with them. A model of another type cannot take
  them, which is an error rather than a silently ignored setting.
  """
  overrides = dict(overrides or {})
  if isinstance(model, str):
    return models_lib.get_model(model, **overrides)
  if isinstance(model, families.config_classes()):
    return models_lib.model_from_config(_with(model, overrides, what))
  if hasattr(model, "step") and hasattr(model, "init_params"):
    if not overrides:
      return model
    if type(model) in families.model_classes():
      return models_lib.model_from_config(_with(model.config, overrides,
                                                what))
    raise ValueError(f"model_overrides {overrides} cannot be applied to the "
                     f"{what}, a {type(model).__name__}: build it with these "
                     f"settings, or pass a preset name or a "
                     f"{_names(families.config_classes(), ' / ')}")
  raise ValueError(f"{what} must be a specdec_jax model "
                   f"({_names(families.model_classes(), ', ')}),"
                   f" a preset name ({', '.join(sorted(models_lib.PRESETS))})"
                   f" or a {_names(families.config_classes(), '/')}, got "
                   f"{type(model).__name__}")


def _names(classes, sep: str) -> str:
  """The classes' names joined by ``sep`` (the families table's order)."""
  return sep.join(c.__name__ for c in classes)


def _with(config, overrides: Mapping[str, Any], what: str):
  """``config`` with ``overrides`` (unknown fields are named)."""
  fields = {f.name for f in dataclasses.fields(config)}
  bad = sorted(k for k in overrides if k not in fields)
  if bad:
    raise ValueError(f"model_overrides for the {what}: "
                     f"{type(config).__name__} has no field {bad[0]!r}")
  return dataclasses.replace(config, **overrides)


def _resolve_method(method, knobs: Mapping[str, Any] | None):
  if isinstance(method, str):
    return registry.make_method(method, **dict(knobs or {}))
  if knobs:
    raise ValueError("method_knobs are only used with a method name; pass "
                     "the knobs to make_method() instead")
  if not hasattr(method, "program"):
    raise ValueError(f"method must be a name in decoding.METHODS or a method "
                     f"object (decoding.make_method), got "
                     f"{type(method).__name__}")
  return method


def place(prefix: jax.Array, prefix_len: jax.Array, tail: jax.Array,
           width: int) -> jax.Array:
  """Row-wise ``prefix[:prefix_len] ++ tail``, cut or 0-padded to width.

  Args:
    prefix: [N, A] ids (entries past prefix_len are ignored).
    prefix_len: [N] int32 in [0, A].
    tail: [N, G] ids.
    width: output width.

  Returns:
    [N, width] int32.
  """
  n, a = prefix.shape
  keep = jnp.arange(a)[None, :] < prefix_len[:, None]
  buf = jnp.zeros((n, a + tail.shape[1]), jnp.int32)
  buf = buf.at[:, :a].set(jnp.where(keep, prefix, 0))
  put = jax.vmap(lambda row, t, at: jax.lax.dynamic_update_slice_in_dim(
      row, t, at, 0))
  buf = put(buf, tail.astype(jnp.int32), prefix_len)  # never clamps: a + G
  if width > buf.shape[1]:
    buf = jnp.pad(buf, ((0, 0), (0, width - buf.shape[1])))
  return buf[:, :width]


def check_batch(batch: Mapping[str, Any], keys: tuple[str, ...]) -> None:
  missing = [k for k in keys if k not in batch]
  if missing:
    raise ValueError(f"batch is missing feature(s) {missing}; it has "
                     f"{sorted(batch)} (use the model's FEATURE_CONVERTER_CLS)")
  packed = [k for k in batch if k.endswith("_segment_ids")]
  if packed:
    raise ValueError(f"packed batches ({packed[0]}) are not supported; set "
                     f"DatasetConfig.pack = False for evaluation/inference")
  shapes = {k: np.shape(batch[k]) for k in keys}
  rows = {s[0] for s in shapes.values() if len(s) == 2}
  if any(len(s) != 2 for s in shapes.values()) or len(rows) != 1:
    raise ValueError(f"features {keys} must be [batch, length] arrays with "
                     f"the same batch size, got shapes {shapes}")


class SpeculativeModel:
  """Shared machinery of the two Model classes (not a t5x class itself)."""

  FEATURE_CONVERTER_CLS = None
  _ENCODER_DECODER: bool

  def __init__(self, drafter, verifier, input_vocabulary, output_vocabulary,
               method="spec_decode", method_knobs=None, gamma: int = 5,
               sampling=None, seed: int | None = None,
               score_decodes: bool = True, model_overrides=None,
               feature_converter_cls=None, optimizer_def=None, tree=None,
               hierarchy=None, tune_file: str | None = None,
               batch_size: int = 1):
    if method == "auto":  # the tune file's row for batch_size
      from specdec_jax.decoding.planners import auto  # pylint: disable=g-import-not-at-top
      if tune_file is None:
        raise ValueError("method='auto' needs tune_file= (written by "
                         "`specdec_jax tune`)")
      method, method_knobs, gamma, tree = auto.load(tune_file).pair_choice(
          batch_size)
    elif tune_file is not None:
      raise ValueError("tune_file is read by method='auto' only")
    self.drafter = _resolve_model(drafter, model_overrides, "drafter")
    self.verifier = _resolve_model(verifier, model_overrides, "verifier")
    kind = "encoder-decoder" if self._ENCODER_DECODER else "decoder-only"
    for what, m in (("drafter", self.drafter), ("verifier", self.verifier)):
      if m.is_encoder_decoder != self._ENCODER_DECODER:
        raise ValueError(f"{type(self).__name__} needs {kind} models; the "
                         f"{what} is {type(m).__name__}")
    self.method = _resolve_method(method, method_knobs)
    self.strategy = sampling_lib.Greedy() if sampling is None else sampling
    # The checks decoding.generate applies, shared (not repeated) here.
    inputs_lib.check_method(self.method, self.strategy)
    inputs_lib.check_models(self.method, self.drafter, self.verifier)
    self.drafting = drafting.resolve(self.method, self.drafter,
                                     self.verifier, gamma, tree, hierarchy)
    self.topology, self.gamma = Topology.chain(gamma), int(gamma)
    self.tree, self.hierarchy = self.drafting.tree, hierarchy
    if seed is not None and not 0 <= int(seed) < 2**32:
      raise ValueError(f"seed must be in [0, 2**32) or None, got {seed}")
    self.seed = seed
    self.score_decodes = bool(score_decodes)
    self._input_vocabulary = input_vocabulary
    self._output_vocabulary = output_vocabulary
    for what, vocab in (("input", input_vocabulary),
                        ("output", output_vocabulary)):
      size = getattr(vocab, "vocab_size", None)
      if size is not None and int(size) > self.verifier.vocab_size:
        raise ValueError(
            f"the {what} vocabulary has {size} ids but the models embed "
            f"{self.verifier.vocab_size}; the vocabulary does not belong to "
            f"these models")
    eos = getattr(output_vocabulary, "eos_id", None)
    self.eos_id = int(eos) if eos is not None else self.verifier.eos_id
    if feature_converter_cls is not None:
      self.FEATURE_CONVERTER_CLS = feature_converter_cls  # pylint: disable=invalid-name
    if optimizer_def is not None:
      raise ValueError("optimizer_def must be None: the speculative Models "
                       "are for evaluation/inference only")
    self.optimizer_def = None

  @property
  def input_vocabulary(self):
    return self._input_vocabulary

  @property
  def output_vocabulary(self):
    return self._output_vocabulary

  # -- variables ---------------------------------------------------------------

  def get_initial_variables(self, rng: jax.Array,
                            input_shapes: Mapping[str, Any] | None = None,
                            input_types: Mapping[str, Any] | None = None):
    """Random variables: the merged params tree and its logical axes.

    Args:
      rng: PRNG key.
      input_shapes, input_types: t5x's feature shapes (unused: the
        parameter shapes do not depend on them).

    Returns:
      FrozenDict ``{'params': {'draft': ..., 'target': ...},
      'params_axes': {...}}``; each parameter ``a/b/kernel`` has an entry
      ``a/b/kernel_axes = AxisMetadata(names=(logical axes))``.
    """
    del input_shapes, input_types
    k_draft, k_target = jax.random.split(rng)
    params = {"draft": self.drafter.init_params(k_draft),
              "target": self.verifier.init_params(k_target)}
    return flax.core.freeze({"params": params,
                             "params_axes": params_axes(params)})

  # -- training is not supported ------------------------------------------

  def loss_fn(self, params, batch, dropout_rng):
    """Raises: these models are for evaluation and inference only."""
    del params, batch, dropout_rng
    raise ValueError(
        f"{type(self).__name__} is for evaluation/inference only and cannot "
        f"be trained: train the drafter and the verifier with their own t5x "
        f"models, then merge the checkpoints (python -m "
        f"specdec_jax.t5x.merge)")

  def eval_fn(self, params, batch):
    """Raises: the loss is a training quantity (use score_batch)."""
    return self.loss_fn(params, batch, None)

  # -- decoding ----------------------------------------------------------------

  def predict_batch(self, params, batch, rng=None):
    """Decodes; returns only the predictions of predict_batch_with_aux."""
    return self.predict_batch_with_aux(params, batch, rng=rng)[0]

  def _seeds(self, rng, rows: int) -> jax.Array:
    if self.seed is not None:
      return jnp.full((rows,), self.seed, jnp.uint32)
    if rng is None:
      return jnp.zeros((rows,), jnp.uint32)
    return jnp.broadcast_to(jax.random.bits(rng, (), jnp.uint32), (rows,))

  def _decoder_params(self, rng, decoder_params):
    """(rng, eos_id, max_decode_steps) from t5x's arguments."""
    dp = dict(decoder_params or {})
    bad = [k for k in dp if k not in _DECODER_PARAMS]
    if bad:
      raise ValueError(f"decoder_params {bad} are not supported; allowed: "
                       f"{list(_DECODER_PARAMS)} (set sampling and method "
                       f"knobs on the model)")
    if dp.get("decode_rng") is not None:
      if rng is not None:
        raise ValueError("got an RNG both from `rng` and from "
                         "decoder_params['decode_rng']; pass one of them")
      rng = dp["decode_rng"]
    eos = dp.get("eos_id", self.eos_id)
    if isinstance(eos, jax.core.Tracer) or int(eos) != eos:
      raise ValueError(f"decoder_params['eos_id'] must be a Python int, got "
                       f"{eos!r}")
    return rng, int(eos), dp.get("max_decode_steps")

  def _decode(self, params, prompt, prompt_len, inputs, ids, rng, max_new,
              width: int, num_decodes: int, eos_id: int):
    """Runs the method on [B] rows x num_decodes (drafting a chain, a tree
    or a hierarchy: ``self.drafting``).

    Args:
      params: {'draft', 'target'}.
      prompt: [B, P] int32 decoder prompts (start/BOS first); prompt_len [B].
      inputs: [B, S] encoder inputs or None.
      ids: [B] int32 request ids.
      rng: PRNG key or None.
      max_new: [B] int32 token budgets.
      width: static output buffer size.
      num_decodes: samples per row.
      eos_id: stop token.

    Returns:
      (LoopOutput of the B * n rows (tokens [B * n, width]), the Batch that
      ran (rows expanded), stats dict of [B * n] arrays; a hierarchy adds
      'level_calls', 'level_drafted', 'level_accepted' [B * n, K + 1],
      cheapest level first).
    """
    if isinstance(num_decodes, bool) or int(num_decodes) != num_decodes or (
        num_decodes < 1):
      raise ValueError(f"num_decodes must be an integer >= 1, got "
                       f"{num_decodes!r}")
    n = int(num_decodes)
    b = prompt.shape[0]
    if n > 1:
      rep = lambda x: None if x is None else jnp.repeat(x, n, axis=0)
      prompt, prompt_len, inputs, max_new = map(
          rep, (prompt, prompt_len, inputs, max_new))
      j = jnp.tile(jnp.arange(n, dtype=jnp.uint32), b)  # [B * n]
      mixed = _fmix32(jnp.repeat(ids, n).astype(jnp.uint32)
                      ^ _fmix32(j * jnp.uint32(0x9E3779B1)))
      ids = jnp.where(j == 0, jnp.repeat(ids, n),
                      (mixed & jnp.uint32(0x7FFFFFFF)).astype(jnp.int32))
    rows = b * n
    req = Request(seed=self._seeds(rng, rows),
                  request_id=ids.astype(jnp.int32),
                  max_new_tokens=jnp.maximum(max_new, 0).astype(jnp.int32))
    batch = inputs_lib.make_batch(prompt, prompt_len, inputs, req,
                                  self.strategy, self.method)
    cfg = self.drafting.config(
        self.method, max_new=width, eos_id=eos_id, pad_id=0,
        sampling=inputs_lib.sampling_static(self.strategy))
    out = self.drafting.run(self.method, params, batch, cfg)
    lower = out.levels[:-1]
    stats = dict(drafted=out.levels[-1].drafted,
                 accepted=out.levels[-1].accepted,
                 verifier_calls=out.levels[-1].calls,
                 drafter_calls=sum(lv.calls for lv in lower),
                 deferrals=out.deferrals)
    stats.update(tokens=out.num_out, finite=out.finite)
    if self.drafting.stack is not None:  # [N, K + 1] per level
      stack = lambda f: jnp.stack([getattr(lv, f) for lv in out.levels], 1)
      stats.update(level_calls=stack("calls"),
                   level_drafted=stack("drafted"),
                   level_accepted=stack("accepted"))
    return out, batch, stats

  def _scores(self, params, batch: Batch, out) -> jax.Array:
    """[N] verifier log-likelihood of each row's generated tokens."""
    if not self.score_decodes:
      return jnp.zeros(out.num_out.shape, jnp.float32)
    p_width = batch.prompt.shape[1]
    full = place(batch.prompt, batch.prompt_len, out.tokens,
                  p_width + out.tokens.shape[1])  # [N, W]
    kw = {"inputs": batch.inputs} if self._ENCODER_DECODER else {}
    logits = self.verifier.forward(params["target"], full[:, :-1], **kw)
    logp = jax.nn.log_softmax(logits.astype(jnp.float32))  # [N, W-1, V]
    tok_lp = jnp.take_along_axis(logp, full[:, 1:, None], axis=-1)[..., 0]
    t = jnp.arange(full.shape[1] - 1)[None, :]
    start = batch.prompt_len[:, None] - 1
    mask = (t >= start) & (t < start + out.num_out[:, None])
    return jnp.sum(jnp.where(mask, tok_lp, 0.0), axis=1)

  def _finish(self, decodes, scores, stats, batch_size: int, n: int,
              return_all_decodes: bool):
    """Sorts the n decodes by score (best last); batch-major outputs."""
    scores = scores.reshape(batch_size, n)
    order = jnp.argsort(scores, axis=1)  # [B, n] ascending
    pick = lambda x: jnp.take_along_axis(
        x.reshape((batch_size, n) + x.shape[1:]),
        order.reshape(order.shape + (1,) * (x.ndim - 1)), axis=1)
    decodes = pick(decodes)
    aux = {"scores": pick(scores.reshape(-1))}
    aux.update({k: pick(v) for k, v in stats.items()})
    if return_all_decodes:
      return decodes, aux
    return decodes[:, -1], {k: v[:, -1] for k, v in aux.items()}

  def _logits_scores(self, logits, targets, weights, return_intermediates):
    """t5x's score_batch arithmetic on [B, T, V] logits."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32))
    tok = jnp.take_along_axis(logp, targets[..., None].astype(jnp.int32),
                              axis=-1)[..., 0]
    token_scores = tok * weights  # [B, T]
    scores = token_scores.sum(-1)
    if not return_intermediates:
      return scores
    return scores, {"decoder": {"target_tokens": (targets,),
                                "loss_weights": (weights,),
                                "token_scores": (token_scores,)}}


def params_axes(params: Mapping[str, Any]) -> dict:
  """The ``params_axes`` collection of a parameter tree.

  Args:
    params: nested dict of arrays or ShapeDtypeStructs (any of our models,
      or the merged {'draft', 'target'} tree).

  Returns:
    A nested dict where each parameter ``.../name`` becomes
    ``.../name_axes = flax.linen.partitioning.AxisMetadata(names=...)`` with
    the logical axes of ``specdec_jax.sharding.param_logical_axes``.
  """
  axes = models_lib.flatten_params(sharding.param_logical_axes(
      flax.core.unfreeze(params)))
  return models_lib.unflatten_params({
      f"{path}_axes": flax_partitioning.AxisMetadata(names=tuple(names))
      for path, names in axes.items()})
