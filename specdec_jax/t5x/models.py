"""t5x Model classes that decode with a drafter and a verifier.

:class:`SpeculativeEncoderDecoderModel` (T5) and
:class:`SpeculativeDecoderOnlyModel` (Gemma) follow the t5x Model API
(``t5x/models.py``: ``get_initial_variables``, ``predict_batch_with_aux``,
``score_batch``, ``FEATURE_CONVERTER_CLS``, vocabularies), so ``t5x/eval.py``
and ``t5x/infer.py`` run speculative decoding and speculative cascades with
``MODEL = @specdec_jax.t5x.models.SpeculativeEncoderDecoderModel()``.

Parameters are ONE tree ``{'draft': ..., 'target': ...}`` (the verifier is
'target'), restored from a merged checkpoint (``specdec_jax.t5x.merge``)
whose state dict holds ``target/draft/...`` and ``target/target/...``.
``params_axes`` carries the logical axes of ``specdec_jax.sharding`` so t5x's
partitioner shards both trees. T5 axis names are t5x's; for Gemma add
``('kv_heads', 'model'), ('head_dim', None)`` to the partitioner's rules.

Decoding runs our jitted loops directly (inside t5x's pjit; nothing syncs
with the host). Per-request randomness: row r's seed comes from ``rng``
(t5x eval passes a key split per batch), or from the constructor's ``seed``
(then a row's tokens do not depend on its batch); its request id is the
batch's integer 'example_id' feature when present, else a 31-bit hash of the
row's non-padding input tokens, so equal rows in any position of any batch
draw the same random numbers. Decode j > 0 of ``num_decodes`` mixes j into
the id (decode 0 equals the single decode).

Drafting (``drafting.py``): a chain of ``gamma`` tokens by default; with
``tree=decoding.Tree(...)`` a token tree per block, verified in one verifier
step; with ``hierarchy=Hierarchy(exits=(k, ...), buffers=(T_0, ...))`` the
drafter, early exits of the verifier (its first k decoder layers, reading
params['target']) and the verifier, as ``generate_hierarchy``. Both keep the
parameter tree ``{'draft', 'target'}`` and the t5x contract unchanged.

Aux outputs are batch-major (t5x re-indexes them with ``x[indices]``):
'scores' (verifier log-likelihood of the generated tokens, used to rank
``num_decodes`` samples), 'tokens', 'drafted', 'accepted',
'verifier_calls', 'drafter_calls', 'deferrals' (per row) and 'finite';
with a hierarchy also 'level_calls', 'level_drafted' and 'level_accepted'
([B, K + 1], cheapest level first).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from specdec_jax.t5x.base import (SpeculativeModel, check_batch, hash_rows,
                                  params_axes, place)
from specdec_jax.t5x.drafting import Hierarchy

try:
  import seqio  # pylint: disable=g-import-not-at-top
  _ENC_DEC_CONVERTER = seqio.EncDecFeatureConverter
  _DECODER_CONVERTER = seqio.DecoderFeatureConverter
except ImportError:  # seqio is an optional extra; t5x always has it.
  _ENC_DEC_CONVERTER = None
  _DECODER_CONVERTER = None

__all__ = ["Hierarchy", "SpeculativeDecoderOnlyModel",
           "SpeculativeEncoderDecoderModel", "hash_rows", "params_axes"]


class SpeculativeEncoderDecoderModel(SpeculativeModel):
  """A T5 drafter + verifier pair as a t5x encoder-decoder Model.

  Args:
    drafter: the small model q: a T5Model, a preset name ('t5_1_1_small')
      or a T5Config.
    verifier: the large model p, same forms.
    input_vocabulary, output_vocabulary: seqio vocabularies (duck-typed:
      ``eos_id`` and ``vocab_size`` are read).
    method: a name in ``decoding.METHODS`` or a method object.
    method_knobs: knobs of a named method, e.g. {'alpha': 0.3}.
    gamma: draft block size >= 1 (chain drafting).
    sampling: a strategy (decoding.Greedy/Temperature/TopK/TopP); default
      greedy.
    seed: fixed seed for every batch (None: derived from t5x's rng).
    score_decodes: compute 'scores' (one extra verifier forward pass).
    model_overrides: config overrides for preset names ({'dtype': ...}).
    feature_converter_cls: replaces seqio.EncDecFeatureConverter.
    optimizer_def: t5x's constructor argument; must be None (no training).
    tree: optional draft tree (a decoding.Tree, a decoding.Topology or a
      list of parent indices): every block drafts it and the verifier checks
      all its nodes in one step (docs/trees.md); gamma is then unused.
    hierarchy: optional :class:`Hierarchy` of early exits of the verifier
      between the drafter and the verifier (docs/t5x.md); gamma is then
      unused. At most one of tree and hierarchy.
    tune_file: with ``method='auto'``: an auto strategy file (``specdec_jax
      tune``); its row for ``batch_size`` (the largest tuned batch size <=
      it) sets method, knobs, gamma and tree.
    batch_size: the batch size the Model decodes (``method='auto'``).
  """

  FEATURE_CONVERTER_CLS = _ENC_DEC_CONVERTER
  _ENCODER_DECODER = True

  def predict_batch_with_aux(self, params, batch, rng=None,
                             decoder_params=None,
                             return_all_decodes: bool = False,
                             num_decodes: int = 1,
                             prompt_with_targets: bool = False):
    """Speculative decoding of a batch of t5x features.

    Args:
      params: {'draft': ..., 'target': ...}.
      batch: 'encoder_input_tokens' [B, S], 'decoder_input_tokens' [B, L]
        (its width L is the decode length); optional 'example_id' [B].
      rng: PRNG key (or decoder_params['decode_rng']).
      decoder_params: optional {'eos_id', 'max_decode_steps',
        'decode_rng'}.
      return_all_decodes: return all ``num_decodes`` samples.
      num_decodes: samples per row, ranked by 'scores'.
      prompt_with_targets: teacher-force the non-EOS decoder input tokens
        (they are the start of each output, as in t5x).

    Returns:
      (decodes [B, L] or [B, n, L] int32, aux dict of [B] or [B, n] arrays).
    """
    if return_all_decodes is None:
      return_all_decodes = False
    if num_decodes is None:
      num_decodes = 1
    check_batch(batch, ("encoder_input_tokens", "decoder_input_tokens"))
    rng, eos_id, steps = self._decoder_params(rng, decoder_params)
    src = jnp.asarray(batch["encoder_input_tokens"], jnp.int32)  # [B, S]
    dec = jnp.asarray(batch["decoder_input_tokens"], jnp.int32)  # [B, L]
    b, length = dec.shape
    start = getattr(self.verifier.config, "decoder_start_id", 0)
    if prompt_with_targets:
      forced = dec * (dec != eos_id)
      prompt = forced.at[:, 0].set(start)  # [B, L]
      plen = 1 + jnp.sum(forced[:, 1:] != 0, axis=1)
    else:
      prompt = jnp.full((b, 1), start, jnp.int32)
      plen = jnp.ones((b,), jnp.int32)
    max_new = length - (plen - 1)
    if steps is not None:
      max_new = jnp.minimum(max_new, jnp.asarray(steps, jnp.int32))
    if "example_id" in batch:
      ids = jnp.asarray(batch["example_id"]).astype(jnp.int32)
    else:
      ids = hash_rows(src)
      if prompt_with_targets:  # the forced prefix is part of the request
        ids = hash_rows(jnp.stack([ids, hash_rows(prompt[:, 1:])], axis=1))
    out, run_batch, stats = self._decode(params, prompt, plen, src, ids, rng,
                                         max_new, length, num_decodes, eos_id)
    decodes = place(run_batch.prompt[:, 1:], run_batch.prompt_len - 1,
                     out.tokens, length)  # [B * n, L]
    scores = self._scores(params, run_batch, out)
    return self._finish(decodes, scores, stats, b, int(num_decodes),
                        return_all_decodes)

  def score_batch(self, params, batch, return_intermediates: bool = False):
    """Log-likelihood of the targets under the verifier ('target').

    Args:
      params: {'draft', 'target'}.
      batch: 'encoder_input_tokens', 'decoder_input_tokens',
        'decoder_target_tokens' and optional 'decoder_loss_weights'
        (default: targets != 0).
      return_intermediates: also return t5x-style intermediates.

    Returns:
      [B] float32 sums of target-token log-probabilities (and the
      intermediates dict).
    """
    check_batch(batch, ("encoder_input_tokens", "decoder_input_tokens",
                         "decoder_target_tokens"))
    targets = jnp.asarray(batch["decoder_target_tokens"])
    weights = batch.get("decoder_loss_weights", targets != 0)
    logits = self.verifier.forward(
        params["target"], jnp.asarray(batch["decoder_input_tokens"]),
        inputs=jnp.asarray(batch["encoder_input_tokens"]))
    return self._logits_scores(logits, targets,
                               jnp.asarray(weights, jnp.float32),
                               return_intermediates)


class SpeculativeDecoderOnlyModel(SpeculativeModel):
  """A decoder-only (Gemma) drafter + verifier pair as a t5x Model.

  Arguments as :class:`SpeculativeEncoderDecoderModel`, with one
  ``vocabulary`` (t5x's DecoderOnlyModel) and ``bos_id``: the token that
  replaces the 0 that seqio's DecoderFeatureConverter shifts in at position
  0 (default the verifier's bos_id, 2 for Gemma; 0 keeps t5x's convention).
  """

  FEATURE_CONVERTER_CLS = _DECODER_CONVERTER
  _ENCODER_DECODER = False

  def __init__(self, drafter, verifier, vocabulary, method="spec_decode",
               method_knobs=None, gamma: int = 5, sampling=None,
               seed: int | None = None, score_decodes: bool = True,
               model_overrides=None, bos_id: int | None = None,
               feature_converter_cls=None, optimizer_def=None, tree=None,
               hierarchy=None):
    super().__init__(drafter, verifier, vocabulary, vocabulary, method=method,
                     method_knobs=method_knobs, gamma=gamma,
                     sampling=sampling, seed=seed,
                     score_decodes=score_decodes,
                     model_overrides=model_overrides,
                     feature_converter_cls=feature_converter_cls,
                     optimizer_def=optimizer_def, tree=tree,
                     hierarchy=hierarchy)
    if bos_id is None:
      bos_id = getattr(self.verifier.config, "bos_id", 0)
    if not 0 <= int(bos_id) < self.verifier.vocab_size:
      raise ValueError(f"bos_id {bos_id} is outside the vocabulary [0, "
                       f"{self.verifier.vocab_size})")
    self.bos_id = int(bos_id)

  def _with_bos(self, tokens: jax.Array) -> jax.Array:
    return tokens.at[:, 0].set(self.bos_id)

  def predict_batch_with_aux(self, params, batch, rng=None, *,
                             return_all_decodes: bool = False,
                             num_decodes: int = 1, decoder_params=None):
    """Continues each prompt ('inputs') with speculative decoding.

    Args:
      params: {'draft': ..., 'target': ...}.
      batch: 'decoder_input_tokens' [B, L] and 'decoder_causal_attention'
        [B, L] (1 on BOS + inputs: the prompt); optional 'example_id'.
      rng: PRNG key (or decoder_params['decode_rng']).
      return_all_decodes: return all ``num_decodes`` samples.
      num_decodes: samples per row, ranked by 'scores'.
      decoder_params: optional {'eos_id', 'max_decode_steps',
        'decode_rng'}.

    Returns:
      (generated tokens [B, L] or [B, n, L] without the prompt (t5x's
      ``remove_prefix``), aux dict of [B] or [B, n] arrays).
    """
    if "decoder_causal_attention" not in batch:
      raise ValueError(
          "batch has no 'decoder_causal_attention': the task must have both "
          "'inputs' and 'targets' features for a decoder-only model")
    check_batch(batch, ("decoder_input_tokens",))
    rng, eos_id, steps = self._decoder_params(rng, decoder_params)
    dec = jnp.asarray(batch["decoder_input_tokens"], jnp.int32)  # [B, L]
    b, length = dec.shape
    inputs = dec * jnp.asarray(batch["decoder_causal_attention"], jnp.int32)
    n_in = jnp.sum(inputs[:, 1:] != 0, axis=1)  # [B] prompt tokens
    prompt = self._with_bos(inputs)  # [B, L]
    max_new = length - n_in
    if steps is not None:
      max_new = jnp.minimum(max_new, jnp.asarray(steps, jnp.int32))
    if "example_id" in batch:
      ids = jnp.asarray(batch["example_id"]).astype(jnp.int32)
    else:
      ids = hash_rows(inputs)
    out, run_batch, stats = self._decode(params, prompt, n_in + 1, None, ids,
                                         rng, max_new, length, num_decodes,
                                         eos_id)
    scores = self._scores(params, run_batch, out)
    return self._finish(out.tokens[:, :length], scores, stats, b,
                        int(num_decodes), return_all_decodes)

  def score_batch(self, params, batch, return_intermediates: bool = False):
    """Log-likelihood of the targets under the verifier ('target').

    The shifted-in 0 at position 0 is replaced by ``bos_id``, as in
    decoding; the attention is causal everywhere.

    Args:
      params: {'draft', 'target'}.
      batch: 'decoder_input_tokens', 'decoder_target_tokens' and optional
        'decoder_loss_weights' (default: targets != 0).
      return_intermediates: also return t5x-style intermediates.

    Returns:
      [B] float32 (and the intermediates dict).
    """
    check_batch(batch, ("decoder_input_tokens", "decoder_target_tokens"))
    targets = jnp.asarray(batch["decoder_target_tokens"])
    weights = batch.get("decoder_loss_weights", targets != 0)
    tokens = self._with_bos(jnp.asarray(batch["decoder_input_tokens"],
                                        jnp.int32))
    logits = self.verifier.forward(params["target"], tokens)
    return self._logits_scores(logits, targets,
                               jnp.asarray(weights, jnp.float32),
                               return_intermediates)
