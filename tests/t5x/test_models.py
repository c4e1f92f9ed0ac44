"""The t5x Model classes, without t5x: variables, decoding, scoring, errors."""

import dataclasses
import os
import sys
import types

import flax
import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.linen import partitioning as flax_partitioning

from specdec_jax import decoding, models, sharding
from specdec_jax.t5x import metrics
from specdec_jax.t5x import models as t5x_models
from tests.decoding.pairs import random_prompts, tiny_pair

LENGTH = 12  # decoder feature length of every batch here


@dataclasses.dataclass
class Vocab:
  """Duck-typed seqio vocabulary."""

  vocab_size: int = 64
  eos_id: int = 1


def _encdec(method="spec_decode", gamma=3, **kw):
  drafter, verifier, qp, pp = tiny_pair("t5")
  model = t5x_models.SpeculativeEncoderDecoderModel(
      drafter, verifier, Vocab(), Vocab(), method=method, gamma=gamma, **kw)
  return model, flax.core.freeze({"draft": qp, "target": pp})


def _src(rows=4, seed=0):
  rng = np.random.default_rng(seed)
  src = np.zeros((rows, 8), np.int32)
  for i, r in enumerate(random_prompts(rng, rows, 64, 3, 8)):
    src[i, :len(r)] = r
  return src


def _encdec_batch(src):
  return {"encoder_input_tokens": src,
          "decoder_input_tokens": np.zeros((len(src), LENGTH), np.int32)}


def _predict(model, params, batch, rng=None, jit=False, **kw):
  """predict_batch_with_aux, eagerly (the decode loop is jitted inside and
  its compiled program is reused across tests) or in one jit, as t5x runs
  it."""
  fn = lambda p, b, r: model.predict_batch_with_aux(p, b, rng=r, **kw)
  if jit:
    fn = jax.jit(fn)
  return jax.device_get(fn(params, batch, rng))


def test_initial_variables_hold_both_trees_and_their_axes():
  model, _ = _encdec()
  variables = jax.eval_shape(  # as t5x's TrainStateInitializer calls it
      lambda r: model.get_initial_variables(r, {}), jax.random.PRNGKey(0))
  assert set(variables) == {"params", "params_axes"}
  params = flax.core.unfreeze(variables["params"])
  assert set(params) == {"draft", "target"}
  model.drafter.check_params(params["draft"])
  model.verifier.check_params(params["target"])
  axes = variables["params_axes"]
  kernel = axes["target"]["decoder"]["logits_dense"]["kernel_axes"]
  assert isinstance(kernel, flax_partitioning.AxisMetadata)
  assert kernel.names == ("embed", "vocab")
  assert axes["draft"]["encoder"]["layers_0"]["attention"]["query"][
      "kernel_axes"].names == ("embed", "joined_kv")
  # What t5x's InferenceState / partitioner read back: one spec per param.
  names = models.flatten_params(flax.core.unfreeze(
      flax_partitioning.get_axis_names(axes)))
  want = models.flatten_params(sharding.param_logical_axes(params))
  assert set(names) == set(models.flatten_params(params))
  assert {k: tuple(v) for k, v in names.items()} == want


def test_initial_variables_gemma_axes():
  drafter, verifier, _, _ = tiny_pair("gemma")
  model = t5x_models.SpeculativeDecoderOnlyModel(drafter, verifier,
                                                 Vocab())
  variables = jax.eval_shape(lambda r: model.get_initial_variables(r),
                             jax.random.PRNGKey(0))
  kv = variables["params_axes"]["target"]["layer_0"]["attn"]["kv"]
  assert kv["kernel_axes"].names == ("embed", "stack", "kv_heads",
                                     "head_dim")


def _reference_scores(model, params, src, tokens):
  """Verifier log-likelihood of [B, N] generated tokens (cached path)."""
  b = len(src)
  dec_in = np.concatenate([np.zeros((b, 1), np.int32), tokens[:, :-1]], 1)
  enc = model.encode(params, jnp.asarray(src))
  cache = model.init_cache(b, dec_in.shape[1] + 1, enc)
  logits, _ = model.step(params, jnp.asarray(dec_in), cache)
  logp = np.asarray(jax.nn.log_softmax(logits))
  lp = np.take_along_axis(logp, tokens[..., None], -1)[..., 0]
  is_eos = tokens == model.eos_id
  last = np.where(is_eos.any(1), is_eos.argmax(1), tokens.shape[1] - 1)
  return (lp * (np.arange(tokens.shape[1])[None] <= last[:, None])).sum(1)


def test_greedy_spec_decode_equals_target_only_with_batch_major_aux():
  model, params = _encdec()
  src = _src()
  drafter, verifier = model.drafter, model.verifier
  qp, pp = params["draft"], params["target"]
  ref = decoding.generate(decoding.TargetOnly(), drafter, verifier, qp, pp,
                          inputs=src, max_new_tokens=LENGTH)
  spec = decoding.generate(decoding.make_method("spec_decode"), drafter,
                           verifier, qp, pp, inputs=src, gamma=3,
                           max_new_tokens=LENGTH)
  decodes, aux = _predict(model, params, _encdec_batch(src), jit=True)
  np.testing.assert_array_equal(decodes, ref.tokens)
  np.testing.assert_array_equal(aux["tokens"], spec.lengths)
  np.testing.assert_array_equal(aux["accepted"], spec.accepted)
  np.testing.assert_array_equal(aux["drafted"], spec.drafted)
  np.testing.assert_array_equal(aux["verifier_calls"], spec.verifier_calls)
  np.testing.assert_array_equal(aux["drafter_calls"], spec.drafter_calls)
  assert 0 < aux["accepted"].sum() < aux["drafted"].sum()  # rejections too
  assert aux["finite"].all()
  np.testing.assert_allclose(
      aux["scores"], _reference_scores(verifier, pp, src, ref.tokens),
      rtol=1e-4, atol=1e-4)
  # Batch-major: permuting the rows permutes every output the same way.
  perm = np.array([2, 0, 3, 1])
  d2, aux2 = _predict(model, params, _encdec_batch(src[perm]))
  np.testing.assert_array_equal(d2, decodes[perm])
  for k in aux:
    np.testing.assert_allclose(aux2[k], aux[k][perm], rtol=1e-5)


def test_sampling_uses_hashed_request_ids_and_rng_seed():
  model, params = _encdec(sampling=decoding.Temperature(1.0))
  src = _src()
  rng = jax.random.PRNGKey(3)
  decodes, aux = _predict(model, params, _encdec_batch(src), rng)
  ids = np.asarray(t5x_models.hash_rows(jnp.asarray(src)))
  seed = int(jax.random.bits(rng, (), jnp.uint32))
  ref = decoding.generate(decoding.make_method("spec_decode"), model.drafter,
                          model.verifier, params["draft"], params["target"],
                          inputs=src, gamma=3, max_new_tokens=LENGTH,
                          sampling=decoding.Temperature(1.0), seeds=seed,
                          request_ids=ids)
  np.testing.assert_array_equal(decodes, ref.tokens)
  np.testing.assert_array_equal(aux["accepted"], ref.accepted)
  greedy, _ = _predict(_encdec()[0], params, _encdec_batch(src))
  assert (decodes != greedy).any()  # really sampled
  # Trailing padding does not change a row's id.
  wide = np.pad(src, ((0, 0), (0, 5)))
  np.testing.assert_array_equal(t5x_models.hash_rows(jnp.asarray(wide)), ids)


def test_fixed_seed_makes_rows_independent_of_their_batch():
  model, params = _encdec(sampling=decoding.Temperature(1.0), seed=11)
  src = _src()
  other = np.concatenate([_src(seed=5)[:3], src[1:2]])  # row 1 -> row 3
  d1, _ = _predict(model, params, _encdec_batch(src), jax.random.PRNGKey(0))
  d2, _ = _predict(model, params, _encdec_batch(other),
                   jax.random.PRNGKey(9))
  np.testing.assert_array_equal(d2[3], d1[1])
  # example_id overrides the hash: the same id gives the same draws.
  batch = _encdec_batch(src)
  batch["example_id"] = np.array([7, 7, 7, 7])
  d3, _ = _predict(model, params, batch)
  ref = decoding.generate(decoding.make_method("spec_decode"), model.drafter,
                          model.verifier, params["draft"], params["target"],
                          inputs=src, gamma=3, max_new_tokens=LENGTH,
                          sampling=decoding.Temperature(1.0), seeds=11,
                          request_ids=[7, 7, 7, 7])
  np.testing.assert_array_equal(d3, ref.tokens)


def test_num_decodes_ranked_by_verifier_score():
  model, params = _encdec(sampling=decoding.Temperature(1.0), seed=4)
  src = _src()
  batch = _encdec_batch(src)
  alld, aux = _predict(model, params, batch, num_decodes=3,
                       return_all_decodes=True)
  assert alld.shape == (4, 3, LENGTH) and aux["scores"].shape == (4, 3)
  assert (np.diff(aux["scores"], axis=1) >= 0).all()
  for j in range(3):
    np.testing.assert_allclose(
        aux["scores"][:, j],
        _reference_scores(model.verifier, params["target"], src, alld[:, j]),
        rtol=1e-4, atol=1e-4)
  best, best_aux = _predict(model, params, batch, num_decodes=3)
  np.testing.assert_array_equal(best, alld[:, -1])
  np.testing.assert_array_equal(best_aux["accepted"], aux["accepted"][:, -1])
  single, _ = _predict(model, params, batch)  # decode 0 == the single one
  for b in range(4):
    assert any((alld[b, j] == single[b]).all() for j in range(3))


def test_prompt_with_targets_forces_the_prefix():
  model, params = _encdec()
  src = _src(rows=2)
  dec = np.zeros((2, LENGTH), np.int32)
  dec[0, :4] = [0, 21, 22, 1]  # EOS is stripped from the forced prefix
  dec[1, :2] = [0, 40]
  decodes, aux = _predict(model, params,
                          {"encoder_input_tokens": src,
                           "decoder_input_tokens": dec},
                          prompt_with_targets=True)
  ref = decoding.generate(decoding.TargetOnly(), model.drafter,
                          model.verifier, params["draft"], params["target"],
                          [[0, 21, 22], [0, 40]], inputs=src,
                          max_new_tokens=[LENGTH - 2, LENGTH - 1])
  np.testing.assert_array_equal(decodes[0, :2], [21, 22])
  np.testing.assert_array_equal(decodes[0, 2:], ref.tokens[0, :LENGTH - 2])
  np.testing.assert_array_equal(decodes[1, :1], [40])
  np.testing.assert_array_equal(decodes[1, 1:], ref.tokens[1, :LENGTH - 1])
  np.testing.assert_array_equal(aux["tokens"], ref.lengths)


def test_score_batch_is_the_verifier_log_likelihood():
  model, params = _encdec()
  src = _src(rows=2)
  targets = np.array([[5, 9, 1, 0, 0, 0], [7, 7, 8, 3, 1, 0]], np.int32)
  dec_in = np.concatenate([np.zeros((2, 1), np.int32), targets[:, :-1]], 1)
  batch = {"encoder_input_tokens": src, "decoder_input_tokens": dec_in,
           "decoder_target_tokens": targets}
  scores = model.score_batch(params, batch)
  want = _reference_scores(model.verifier, params["target"], src, targets)
  np.testing.assert_allclose(scores, want, rtol=1e-5, atol=1e-5)
  weights = (np.arange(6)[None] < 2).astype(np.float32).repeat(2, 0)
  scores2, inter = model.score_batch(
      params, dict(batch, decoder_loss_weights=weights),
      return_intermediates=True)
  np.testing.assert_allclose(scores2, inter["decoder"]["token_scores"][0][
      :, :2].sum(1), rtol=1e-6)
  assert (np.asarray(scores2) > np.asarray(scores)).all()


def test_decoder_only_predict_and_score():
  drafter, verifier, qp, pp = tiny_pair("gemma")
  model = t5x_models.SpeculativeDecoderOnlyModel(
      drafter, verifier, Vocab(), method="spec_decode",
      gamma=3)
  params = {"draft": qp, "target": pp}
  # inputs [9, 4, 6] / [5]; targets follow (ignored by prediction).
  dec = np.zeros((2, LENGTH), np.int32)
  dec[0, :6] = [0, 9, 4, 6, 30, 31]
  dec[1, :3] = [0, 5, 17]
  causal = np.zeros_like(dec)
  causal[0, :4] = 1
  causal[1, :2] = 1
  batch = {"decoder_input_tokens": dec, "decoder_causal_attention": causal}
  decodes, aux = _predict(model, params, batch)
  bos = verifier.config.bos_id
  ref = decoding.generate(decoding.TargetOnly(), drafter, verifier, qp, pp,
                          [[bos, 9, 4, 6], [bos, 5]],
                          max_new_tokens=[LENGTH - 3, LENGTH - 1])
  np.testing.assert_array_equal(decodes[:, :LENGTH - 1], ref.tokens)
  np.testing.assert_array_equal(decodes[:, LENGTH - 1], [0, 0])
  np.testing.assert_array_equal(aux["tokens"], ref.lengths)
  # score_batch: causal LM log-likelihood with BOS in position 0.
  targets = np.concatenate([dec[:, 1:], np.zeros((2, 1), np.int32)], 1)
  weights = (targets != 0) & (causal == 0)
  scores = model.score_batch(params, {"decoder_input_tokens": dec,
                                      "decoder_target_tokens": targets,
                                      "decoder_loss_weights": weights})
  tokens = dec.copy()
  tokens[:, 0] = bos
  cache = verifier.init_cache(2, LENGTH + 1)
  logits, _ = verifier.step(pp, jnp.asarray(tokens), cache)
  logp = np.asarray(jax.nn.log_softmax(logits))
  lp = np.take_along_axis(logp, targets[..., None], -1)[..., 0]
  np.testing.assert_allclose(scores, (lp * weights).sum(1), rtol=1e-5)


def test_feature_converters_follow_seqio_availability():
  try:
    import seqio  # pylint: disable=g-import-not-at-top
  except ImportError:
    seqio = None
  enc = t5x_models.SpeculativeEncoderDecoderModel.FEATURE_CONVERTER_CLS
  dec = t5x_models.SpeculativeDecoderOnlyModel.FEATURE_CONVERTER_CLS
  if seqio is None:
    assert enc is None and dec is None
  else:
    assert enc is seqio.EncDecFeatureConverter
    assert dec is seqio.DecoderFeatureConverter


@pytest.mark.parametrize("kwargs,message", [
    (dict(method="nope"), "unknown method"),
    (dict(method="lossy_greedy", sampling=decoding.Temperature(0.5)),
     "greedy method"),
    (dict(gamma=0), "gamma must be an integer >= 1"),
    (dict(method="token_v3", method_knobs={"alpha": 2.0}), "alpha"),
    (dict(method="chow", method_knobs={"beta": 1.0}), "bad knobs"),
    (dict(sampling="greedy"), "sampling must be a strategy"),
    (dict(seed=-1), "seed must be"),
    (dict(optimizer_def=object()), "optimizer_def must be None"),
])
def test_bad_construction_raises(kwargs, message):
  with pytest.raises(ValueError, match=message):
    _encdec(**kwargs)


def test_model_kind_and_vocabulary_are_checked():
  g = tiny_pair("gemma")[1]
  with pytest.raises(ValueError, match="needs encoder-decoder models"):
    t5x_models.SpeculativeEncoderDecoderModel(g, g, Vocab(), Vocab())
  with pytest.raises(ValueError, match="input vocabulary has 99999 ids"):
    t5x_models.SpeculativeEncoderDecoderModel(
        "t5_tiny", "t5_tiny", Vocab(vocab_size=99999), Vocab())
  with pytest.raises(ValueError, match="must be a specdec_jax model"):
    t5x_models.SpeculativeEncoderDecoderModel(3, "t5_tiny", Vocab(), Vocab())
  small = models.get_model("t5_tiny", vocab_size=32)
  with pytest.raises(ValueError, match="vocabularies differ"):
    t5x_models.SpeculativeEncoderDecoderModel(small, "t5_tiny", Vocab(32),
                                              Vocab(32))
  # A preset name with overrides builds the model.
  m = t5x_models.SpeculativeEncoderDecoderModel(
      "t5_tiny", "t5_tiny", Vocab(), Vocab(),
      model_overrides={"dtype": "bfloat16"})
  assert m.verifier.config.dtype == "bfloat16" and m.eos_id == 1


def test_training_and_bad_batches_raise():
  model, params = _encdec()
  with pytest.raises(ValueError, match="evaluation/inference only"):
    model.loss_fn(params, {}, None)
  with pytest.raises(ValueError, match="evaluation/inference only"):
    model.eval_fn(params, {})
  src = _src(rows=2)
  batch = _encdec_batch(src)
  with pytest.raises(ValueError, match="missing feature"):
    model.predict_batch_with_aux(params, {"encoder_input_tokens": src})
  with pytest.raises(ValueError, match="packed batches"):
    model.score_batch(params, dict(batch, decoder_target_tokens=src,
                                   decoder_segment_ids=src))
  with pytest.raises(ValueError, match="not supported; allowed"):
    model.predict_batch_with_aux(params, batch,
                                 decoder_params={"temperature": 0.5})
  with pytest.raises(ValueError, match="both from `rng`"):
    model.predict_batch_with_aux(
        params, batch, rng=jax.random.PRNGKey(0),
        decoder_params={"decode_rng": jax.random.PRNGKey(1)})
  with pytest.raises(ValueError, match="must be \\[batch, length\\] arrays"):
    model.predict_batch_with_aux(params, {"encoder_input_tokens": src[0],
                                          "decoder_input_tokens": src})
  with pytest.raises(ValueError, match="num_decodes must be"):
    model.predict_batch_with_aux(params, batch, num_decodes=0)
  g = t5x_models.SpeculativeDecoderOnlyModel("gemma2_tiny", "gemma2_tiny",
                                             Vocab())
  with pytest.raises(ValueError, match="decoder_causal_attention"):
    g.predict_batch_with_aux(params, {"decoder_input_tokens": src})


GIN_T5X = os.path.join(os.path.dirname(__file__), "..", "..", "gin", "t5x")


def _gin_text(name):
  with open(os.path.join(GIN_T5X, name), encoding="utf-8") as f:
    return f.read()


def test_run_gin_files_include_t5x_runs_and_the_model():
  for name, run in (("spec_cascade_eval.gin", "eval"),
                    ("spec_cascade_infer.gin", "infer")):
    text = _gin_text(name)
    assert f"include 't5x/configs/runs/{run}.gin'" in text
    assert "include 't5x/spec_cascade_model.gin'" in text
  assert "infer_script.infer.mode = 'predict_with_aux'" in _gin_text(
      "spec_cascade_infer.gin")


def test_model_gin_file_parses_and_builds(monkeypatch):
  """The MODEL gin without t5x (t5x's run gins need t5x's sources)."""
  text = _gin_text("spec_cascade_model.gin")
  assert "MODEL = @specdec_jax.t5x.models.SpeculativeEncoderDecoderModel()" \
      in text
  try:
    import seqio  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError:  # the file's `import seqio`: a stand-in module

    class SentencePieceVocabulary:

      def __init__(self, sentencepiece_model_file, extra_ids=0):
        self.path, self.extra_ids = sentencepiece_model_file, extra_ids

    monkeypatch.setitem(sys.modules, "seqio", types.SimpleNamespace(
        __name__="seqio", SentencePieceVocabulary=SentencePieceVocabulary))
  gin.clear_config()
  try:
    gin.parse_config(text)
    gin.parse_config("\n".join([
        "from __gin__ import dynamic_registration",
        "import tests.t5x.test_models",
        # The real vocabulary lives on GCS; no network in tests.
        "VOCABULARY = @tests.t5x.test_models.Vocab()",
        "tests.t5x.test_models.Vocab.vocab_size = 32100",
        "GAMMA = 7"]))
    model = gin.query_parameter("%MODEL").scoped_configurable_fn()
  finally:
    gin.clear_config()
  assert isinstance(model, t5x_models.SpeculativeEncoderDecoderModel)
  assert isinstance(model.method.target, decoding.TokenV3)
  assert float(model.method.target.alpha) == 0.3
  assert model.gamma == 7
  assert model.strategy == decoding.Temperature(0.0)
  assert model.drafter.config == dataclasses.replace(
      models.T5_PRESETS["t5_1_1_small"], dtype="bfloat16")
  assert model.verifier.config.d_model == 1024  # t5_1_1_large
  assert model.input_vocabulary.vocab_size == 32100 and model.seed is None


def test_speculative_metrics_exact_values():
  aux = {"tokens": [8, 4], "drafted": [12, 6], "accepted": [6, 0],
         "verifier_calls": [4, 2], "drafter_calls": [12, 6],
         "deferrals": [1.0, 0.5], "scores": [-1.0, -2.0]}
  out = metrics.speculative_metrics([], [], aux)
  assert out == {"acceptance_rate": 6 / 18, "block_efficiency": 12 / 6,
                 "deferral_rate": 1.5 / 12, "verifier_calls_per_example": 3.0,
                 "drafter_calls_per_example": 9.0,
                 "tokens_per_example": 6.0}
  zero = dict(aux, drafted=[0, 0])
  assert np.isnan(metrics.speculative_metrics([], [], zero)["acceptance_rate"])
  with pytest.raises(ValueError, match=r"lack \['accepted'\]"):
    metrics.speculative_metrics([], [], {k: v for k, v in aux.items()
                                         if k != "accepted"})


def test_speculative_metrics_skips_a_stock_t5x_model():
  # t5x's EncoderDecoderModel.predict_batch_with_aux returns only 'scores':
  # a baseline run on the same task gets no speculative metrics, no error.
  assert metrics.speculative_metrics(["a"], ["a"], {"scores": [-1.5]}) == {}
  assert metrics.speculative_metrics(["a"], ["a"], {}) == {}


def test_decoding_state_has_t5x_fields():
  from specdec_jax.t5x import decoding as t5x_decoding  # pylint: disable=g-import-not-at-top
  fields = {f.name for f in dataclasses.fields(t5x_decoding.DecodingState)}
  assert fields == {"cur_index", "sequences", "cur_token", "cache"}


def test_seq_cascade_runs_inside_jit_like_generate():
  """SeqCascade decides with lax.cond, so it also runs in t5x's pjit."""
  model, params = _encdec(method="seq_cascade", method_knobs={"alpha": 0.6})
  src = _src()
  ref = decoding.generate(decoding.make_method("seq_cascade", alpha=0.6),
                          model.drafter, model.verifier, params["draft"],
                          params["target"], inputs=src, max_new_tokens=LENGTH)
  decodes, aux = _predict(model, params, _encdec_batch(src), jit=True)
  np.testing.assert_array_equal(decodes, ref.tokens)
  np.testing.assert_array_equal(aux["verifier_calls"], ref.verifier_calls)
