"""Against the real t5x sources (skipped when ``import t5x`` fails).

CI has no t5x (it is not on PyPI); run locally with the t5x, airio and
jestimator sources on PYTHONPATH (docs/t5x.md, "Testing against t5x").
"""

import functools
import os
import sys

import flax
import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

t5x = pytest.importorskip("t5x")
seqio = pytest.importorskip("seqio")

# pylint: disable=g-import-not-at-top,g-bad-import-order
from jax.sharding import PartitionSpec as P
from t5x import decoding as t5x_decoding
from t5x import models as t5x_models
from t5x import partitioning
from t5x import utils as t5x_utils
from t5x.examples.decoder_only import network as do_network
from t5x.examples.t5 import network as t5_network

from specdec_jax import models as models_lib
from specdec_jax.t5x import decoding as our_decoding
from specdec_jax.t5x import models as our_models
from tests.decoding.pairs import tiny_pair
from tests.t5x.helpers import successor_decoder, t5x_style_decoder
# pylint: enable=g-import-not-at-top,g-bad-import-order

pytestmark = pytest.mark.t5x
GIN_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "gin")
VOCAB = 64


def test_decoding_state_is_t5x_class():
  assert our_decoding.DecodingState is t5x_decoding.DecodingState


@pytest.mark.parametrize("kwargs", [
    dict(),
    dict(num_decodes=3),
    dict(rescale_log_probs=False),
    dict(max_decode_steps=2),
    dict(initial_index=jnp.array([3, 1, 0])),
    dict(initial_index=jnp.array([3, 1, 0]), num_decodes=2,
         max_decode_steps=3),
])
def test_greedy_matches_t5x_temperature_sample_on_a_fake(kwargs):
  ttl, _ = successor_decoder(8)
  inputs = jnp.array([[0, 5, 6, 1, 0, 0, 0], [0, 2, 0, 0, 0, 0, 0],
                      [0, 0, 0, 0, 0, 0, 0]])
  cache = {"calls": jnp.zeros((3,), jnp.int32)}
  common = dict(inputs=inputs, cache=cache, tokens_to_logits=ttl, eos_id=4,
                temperature=0.0, **kwargs)
  ours = our_decoding.temperature_sample(**common)
  theirs = t5x_decoding.temperature_sample(**common)
  np.testing.assert_array_equal(ours[0], theirs[0])
  np.testing.assert_allclose(ours[1], theirs[1], rtol=1e-6)


def test_greedy_matches_t5x_on_our_t5_with_prompt_and_two_decodes():
  _, model, _, params = tiny_pair("t5")
  src = jnp.array([[5, 9, 13, 2, 0], [7, 3, 0, 0, 0]])
  inputs = jnp.array([[0, 11, 12, 0, 0, 0, 0, 0, 0, 0],
                      [0, 0, 0, 0, 0, 0, 0, 0, 0, 0]])
  out = {}
  for name, fn in (("ours", our_decoding.temperature_sample),
                   ("t5x", t5x_decoding.temperature_sample)):
    cache, ttl = t5x_style_decoder(model, params, 2, 20, src=src,
                                   num_decodes=2)
    out[name] = fn(inputs=inputs, cache=cache, tokens_to_logits=ttl,
                   eos_id=model.eos_id, num_decodes=2, temperature=0.0,
                   rescale_log_probs=False)
  np.testing.assert_array_equal(out["ours"][0], out["t5x"][0])
  np.testing.assert_allclose(out["ours"][1], out["t5x"][1], rtol=1e-5)


def _t5x_encdec(decode_fn):
  cfg = t5_network.T5Config(
      vocab_size=VOCAB, emb_dim=32, num_heads=4, num_encoder_layers=2,
      num_decoder_layers=2, head_dim=8, mlp_dim=64,
      mlp_activations=("gelu", "linear"), dropout_rate=0.0)
  vocab = seqio.PassThroughVocabulary(VOCAB, eos_id=1)
  return t5x_models.EncoderDecoderModel(
      t5_network.Transformer(cfg), vocab, vocab, optimizer_def=None,
      decode_fn=decode_fn)


@pytest.mark.parametrize("prompt_with_targets", [False, True])
def test_our_decode_fn_inside_t5x_encoder_decoder_model(prompt_with_targets):
  ours = _t5x_encdec(functools.partial(our_decoding.temperature_sample,
                                       temperature=0.0))
  theirs = _t5x_encdec(functools.partial(t5x_decoding.temperature_sample,
                                         temperature=0.0))
  shapes = {"encoder_input_tokens": (3, 6), "decoder_input_tokens": (3, 9)}
  variables = ours.get_initial_variables(jax.random.PRNGKey(0), shapes)
  # Sharper logits so the random network's greedy output varies.
  params = jax.tree.map(lambda x: x * 3.0, variables["params"])
  rng = np.random.default_rng(0)
  dec = np.zeros((3, 9), np.int32)
  dec[0, 1:3] = [7, 8]
  batch = {"encoder_input_tokens": rng.integers(2, VOCAB, (3, 6)),
           "decoder_input_tokens": dec}
  for n in (1, 2):
    a = jax.jit(functools.partial(  # in one jit, as t5x's pjit runs it
        ours.predict_batch_with_aux, num_decodes=n, return_all_decodes=True,
        prompt_with_targets=prompt_with_targets))(params, batch)
    b = theirs.predict_batch_with_aux(params, batch, num_decodes=n,
                                      return_all_decodes=True,
                                      prompt_with_targets=prompt_with_targets)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_allclose(a[1]["scores"], b[1]["scores"], atol=1e-6)
  assert len({tuple(r) for r in np.asarray(a[0][:, 0])}) == 3


def test_our_decode_fn_inside_t5x_decoder_only_model_prefill():
  cfg = do_network.TransformerConfig(
      vocab_size=VOCAB, emb_dim=32, num_heads=4, num_layers=2, head_dim=8,
      mlp_dim=64, mlp_activations=("gelu", "linear"), dropout_rate=0.0)
  vocab = seqio.PassThroughVocabulary(VOCAB, eos_id=1)
  build = lambda fn: t5x_models.DecoderOnlyModel(
      do_network.DecoderWrapper(cfg), vocab, optimizer_def=None,
      decode_fn=functools.partial(fn, temperature=0.0))
  ours = build(our_decoding.temperature_sample)
  theirs = build(t5x_decoding.temperature_sample)
  variables = ours.get_initial_variables(
      jax.random.PRNGKey(1), {"decoder_input_tokens": (3, 10)})
  params = jax.tree.map(lambda x: x * 3.0, variables["params"])
  dec = np.zeros((3, 10), np.int32)
  dec[0, :6] = [0, 9, 4, 6, 30, 31]
  dec[1, :3] = [0, 5, 17]
  dec[2, :2] = [0, 40]
  causal = np.zeros_like(dec)
  causal[0, :4], causal[1, :2], causal[2, :2] = 1, 1, 1
  batch = {"decoder_input_tokens": dec, "decoder_causal_attention": causal}
  for n in (1, 2):
    a = jax.jit(functools.partial(ours.predict_batch_with_aux,
                                  num_decodes=n, return_all_decodes=True))(
                                      params, batch)
    b = theirs.predict_batch_with_aux(params, batch, num_decodes=n,
                                      return_all_decodes=True)
    np.testing.assert_array_equal(a[0], b[0])
  assert (np.asarray(a[0])[:, 0, 0] != 0).all()  # generated, prefix removed


def _partitioner(extra_rules=()):
  rules = partitioning.standard_logical_axis_rules(
      additional_rules=list(extra_rules))
  return partitioning.PjitPartitioner(num_partitions=1,
                                      logical_axis_rules=rules)


def test_t5x_partitioner_and_infer_fn_run_our_encoder_decoder_model():
  drafter, verifier, _, _ = tiny_pair("t5")
  vocab = seqio.PassThroughVocabulary(VOCAB, eos_id=1)
  model = our_models.SpeculativeEncoderDecoderModel(
      drafter, verifier, vocab, vocab, method="token_v3",
      method_knobs={"alpha": 0.3}, gamma=3)
  partitioner = _partitioner()
  shapes = {"encoder_input_tokens": (4, 8), "decoder_input_tokens": (4, 10),
            "decoder_target_tokens": (4, 10), "decoder_loss_weights": (4, 10)}
  init = t5x_utils.TrainStateInitializer(
      optimizer_def=None, init_fn=model.get_initial_variables,
      input_shapes=shapes, partitioner=partitioner)
  axes = init.train_state_axes.params
  assert axes["target"]["decoder"]["logits_dense"]["kernel"] == P(
      None, "model")
  assert axes["draft"]["token_embedder"]["embedding"] == P("model", None)
  assert axes["draft"]["encoder"]["layers_0"]["mlp"]["wo"]["kernel"] == P(
      "model", None)
  state = init.from_scratch(jax.random.PRNGKey(0))
  # Six examples, batch 4: t5x pads the last batch and re-indexes outputs.
  rng = np.random.default_rng(0)
  src = rng.integers(2, VOCAB, (6, 8)).astype(np.int32)
  src[:, 5:] = 0
  feats = {"encoder_input_tokens": src,
           "decoder_input_tokens": np.zeros((6, 10), np.int32)}
  tf = pytest.importorskip("tensorflow")
  ds = tf.data.Dataset.from_tensor_slices(feats).enumerate()
  infer_fn = t5x_utils.get_infer_fn(
      infer_step=model.predict_batch_with_aux, batch_size=4,
      train_state_axes=init.train_state_axes, partitioner=partitioner)
  indexed, aux = infer_fn(ds, train_state=state, rng=jax.random.PRNGKey(0))
  assert [i for i, _ in indexed] == list(range(6))
  want, want_aux = model.predict_batch_with_aux(state.params, feats)
  np.testing.assert_array_equal(np.array([p for _, p in indexed]), want)
  for key in ("accepted", "drafted", "verifier_calls", "tokens"):
    np.testing.assert_array_equal(aux[key], want_aux[key])
  np.testing.assert_allclose(aux["scores"], want_aux["scores"], rtol=1e-4)
  # score_batch runs partitioned too (t5x's score_fn).
  score = partitioner.partition(
      model.score_batch, in_axis_resources=(axes, P("data")),
      out_axis_resources=None)
  tgt = np.pad(src, ((0, 0), (0, 2)))  # [6, 10] targets
  batch = {"encoder_input_tokens": src, "decoder_target_tokens": tgt,
           "decoder_input_tokens": np.pad(tgt[:, :-1], ((0, 0), (1, 0)))}
  np.testing.assert_allclose(score(state.params, batch),
                             model.score_batch(state.params, batch),
                             rtol=1e-5)


def test_t5x_partitioner_with_gemma_rules():
  drafter, verifier, _, _ = tiny_pair("gemma")
  vocab = seqio.PassThroughVocabulary(VOCAB, eos_id=1)
  model = our_models.SpeculativeDecoderOnlyModel(drafter, verifier, vocab)
  init = t5x_utils.TrainStateInitializer(
      optimizer_def=None, init_fn=model.get_initial_variables,
      input_shapes={"decoder_input_tokens": (2, 8)},
      partitioner=_partitioner([("kv_heads", "model"), ("head_dim", None)]))
  kv = init.train_state_axes.params["target"]["layer_0"]["attn"]["kv"]
  assert kv["kernel"] == P(None, None, "model", None)


@pytest.mark.parametrize("run", ["eval", "infer"])
def test_gin_files_parse_with_t5x_run_gins(monkeypatch, run):
  script = __import__(f"t5x.{run}", fromlist=["_"])
  monkeypatch.setitem(sys.modules, "__main__", script)  # `import __main__`
  out_dir = "EVAL_OUTPUT_DIR" if run == "eval" else "INFER_OUTPUT_DIR"
  gin.clear_config()
  try:
    gin.add_config_file_search_path(os.path.dirname(
        os.path.dirname(t5x.__file__)))
    gin.add_config_file_search_path(GIN_DIR)
    gin.parse_config_files_and_bindings(
        [f"t5x/spec_cascade_{run}.gin"],
        ["from __gin__ import dynamic_registration", "import seqio",
         "MIXTURE_OR_TASK_NAME = 'wmt_t2t_ende_v003'",
         "TASK_FEATURE_LENGTHS = {'inputs': 64, 'targets': 64}",
         "CHECKPOINT_PATH = '/ckpts/merged/checkpoint_0'",
         f"{out_dir} = '/tmp/out'",
         # The real vocabulary lives on GCS; no network in tests.
         "VOCABULARY = @seqio.PassThroughVocabulary()",
         "seqio.PassThroughVocabulary.size = 32128",
         "seqio.PassThroughVocabulary.eos_id = 1", "ALPHA = 0.4"])
    model = gin.query_parameter("%MODEL").scoped_configurable_fn()
    assert isinstance(model, our_models.SpeculativeEncoderDecoderModel)
    assert float(model.method.target.alpha) == 0.4
    assert model.gamma == 5 and model.drafter.config.d_model == 512
    assert model.verifier.config.d_model == 1024
    assert model.verifier.config.dtype == "bfloat16"
    assert gin.query_parameter("%CHECKPOINT_PATH") == (
        "/ckpts/merged/checkpoint_0")
    if run == "infer":
      assert gin.query_parameter("infer_script.infer.mode") == (
          "predict_with_aux")
      # Parameters are restored in COMPUTE_DTYPE, not t5x's bfloat16.
      assert _restore_dtype() == "bfloat16"
      with gin.unlock_config():
        gin.parse_config(["COMPUTE_DTYPE = 'float32'"])
      assert _restore_dtype() == "float32"
      with gin.unlock_config():
        gin.parse_config(["RESTORE_DTYPE = 'bfloat16'"])
      assert _restore_dtype() == "bfloat16"
  finally:
    gin.clear_config()


def _restore_dtype():
  """The dtype t5x's RestoreCheckpointConfig gets from the parsed gins."""
  cfg = gin.get_configurable(t5x_utils.RestoreCheckpointConfig)(path="/x")
  return cfg.dtype


@pytest.mark.parametrize("layout,use_orbax", [("legacy", False),
                                              ("legacy", True),
                                              ("orbax", True)])
def test_t5x_restores_a_merged_checkpoint(tmp_path, layout, use_orbax):
  """eval.py's restore path loads merge's output into our Model's state."""
  from specdec_jax.checkpoints import t5x_write  # pylint: disable=g-import-not-at-top
  from specdec_jax.t5x import merge  # pylint: disable=g-import-not-at-top
  drafter, verifier, qp, pp = tiny_pair("t5")
  host = lambda t: jax.tree.map(np.asarray, t)
  t5x_write.save_t5x(str(tmp_path / "d" / "checkpoint_10"), host(qp))
  t5x_write.save_t5x(str(tmp_path / "t" / "checkpoint_20"), host(pp))
  path = merge.merge(str(tmp_path / "d"), str(tmp_path / "t"),
                     str(tmp_path / "merged"), step=5, layout=layout)
  vocab = seqio.PassThroughVocabulary(VOCAB, eos_id=1)
  model = our_models.SpeculativeEncoderDecoderModel(drafter, verifier, vocab,
                                                    vocab)
  partitioner = _partitioner()
  init = t5x_utils.TrainStateInitializer(
      optimizer_def=None, init_fn=model.get_initial_variables,
      input_shapes={"encoder_input_tokens": (2, 8),
                    "decoder_input_tokens": (2, 8)},
      partitioner=partitioner)
  cfg = t5x_utils.RestoreCheckpointConfig(path=path, mode="specific",
                                          strict=False, dtype="float32")
  cfg, paths = t5x_utils.get_first_valid_restore_config_and_paths([cfg])
  state, _ = t5x_utils.create_checkpoint_manager_and_restore(
      init, partitioner, cfg, paths[0], None, use_orbax=use_orbax)
  assert int(state.step) == 5
  got = models_lib.flatten_params(flax.core.unfreeze(state.params))
  want = models_lib.flatten_params({"draft": host(qp), "target": host(pp)})
  assert set(got) == set(want)
  for k in want:
    np.testing.assert_array_equal(np.asarray(got[k]), want[k], k)


@pytest.mark.slow
def test_t5x_eval_script_end_to_end(tmp_path):
  """`python -m t5x.eval` with our gin file, a merged checkpoint and a tiny
  seqio task: greedy spec_decode predictions equal target-only decoding,
  and the acceptance statistics reach t5x's metrics."""
  import json  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  from specdec_jax import decoding  # pylint: disable=g-import-not-at-top
  from specdec_jax.checkpoints import t5x_write  # pylint: disable=g-import-not-at-top
  from specdec_jax.t5x import merge  # pylint: disable=g-import-not-at-top
  from tests.t5x import tiny_task  # pylint: disable=g-import-not-at-top
  drafter, verifier, qp, pp = tiny_pair("t5")
  host = lambda t: jax.tree.map(np.asarray, t)
  t5x_write.save_t5x(str(tmp_path / "d" / "checkpoint_1"), host(qp))
  t5x_write.save_t5x(str(tmp_path / "t" / "checkpoint_1"), host(pp))
  ckpt = merge.merge(str(tmp_path / "d"), str(tmp_path / "t"),
                     str(tmp_path / "merged"), step=3)
  out = tmp_path / "eval"
  root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      [root] + os.environ.get("PYTHONPATH", "").split(os.pathsep)),
             JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2")
  bindings = [
      # Bindings that reference configurables need gin's imports.
      "from __gin__ import dynamic_registration", "import seqio",
      "from t5x import utils", "MIXTURE_OR_TASK_NAME='specdec_tiny_copy'",
      "MIXTURE_OR_TASK_MODULE='tests.t5x.tiny_task'",
      "TASK_FEATURE_LENGTHS={'inputs': 8, 'targets': 8}",
      f"CHECKPOINT_PATH='{ckpt}'", f"EVAL_OUTPUT_DIR='{out}'",
      "utils.DatasetConfig.split='validation'",
      "utils.DatasetConfig.batch_size=4",
      "DRAFTER='t5_tiny'", "VERIFIER='t5_tiny'", "COMPUTE_DTYPE='float32'",
      "METHOD='spec_decode'", "METHOD_KNOBS={}", "GAMMA=3",
      "VOCABULARY=@seqio.PassThroughVocabulary()",
      "seqio.PassThroughVocabulary.size=64",
      "seqio.PassThroughVocabulary.eos_id=1"]
  cmd = [sys.executable, "-m", "t5x.eval", f"--gin_search_paths={GIN_DIR}",
         "--gin_file=t5x/spec_cascade_eval.gin"] + [
             f"--gin_bindings={b}" for b in bindings]
  proc = subprocess.run(cmd, env=env, cwd=root, capture_output=True,
                        text=True, timeout=900, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  logs = out / "inference_eval"
  with open(logs / "specdec_tiny_copy-metrics.jsonl") as f:
    metrics = json.loads(f.readlines()[-1])
  assert 0.0 <= metrics["acceptance_rate"] <= 1.0
  assert metrics["block_efficiency"] >= 1.0
  assert metrics["tokens_per_example"] > 0
  with open(logs / "specdec_tiny_copy-000003.jsonl") as f:
    rows = [json.loads(line) for line in f]
  ids = tiny_task.examples()
  src = np.concatenate([ids, np.ones((len(ids), 1), np.int32)], axis=1)
  ref = decoding.generate(decoding.TargetOnly(), drafter, verifier, qp, pp,
                          inputs=src, max_new_tokens=8)
  want = [list(t[:n]) for t, n in zip(ref.tokens, ref.lengths)]
  want = [w[:-1] if w and w[-1] == 1 else w for w in want]  # decode: no EOS
  got = {tuple(r["input"]["inputs"]): r for r in rows}
  assert len(got) == len(ids)
  for i, row in enumerate(src):
    r = got[tuple(row.tolist())]
    assert r["prediction"] == want[i], i
    assert r["aux_tokens"] == ref.lengths[i]  # aux follows its example
    assert r["aux_drafted"] == 3 * r["aux_verifier_calls"]


@pytest.mark.slow
def test_t5x_infer_script_float32_parity(tmp_path):
  """`python -m t5x.infer` with spec_cascade_infer.gin and COMPUTE_DTYPE
  'float32': the parameters are restored in float32 (t5x's infer.gin alone
  restores bfloat16), so greedy speculative predictions equal float32
  target-only decoding on every row."""
  import glob  # pylint: disable=g-import-not-at-top
  import json  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  from specdec_jax import decoding  # pylint: disable=g-import-not-at-top
  from specdec_jax.checkpoints import t5x_write  # pylint: disable=g-import-not-at-top
  from specdec_jax.t5x import merge  # pylint: disable=g-import-not-at-top
  from tests.t5x import tiny_task  # pylint: disable=g-import-not-at-top
  drafter, verifier, qp, pp = tiny_pair("t5")
  host = lambda t: jax.tree.map(np.asarray, t)
  t5x_write.save_t5x(str(tmp_path / "d" / "checkpoint_1"), host(qp))
  t5x_write.save_t5x(str(tmp_path / "t" / "checkpoint_1"), host(pp))
  ckpt = merge.merge(str(tmp_path / "d"), str(tmp_path / "t"),
                     str(tmp_path / "merged"), step=3)
  out = tmp_path / "infer"
  root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      [root] + os.environ.get("PYTHONPATH", "").split(os.pathsep)),
             JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2")
  (tmp_path / "vocab.gin").write_text(
      "from __gin__ import dynamic_registration\nimport seqio\n"
      "from t5x import utils\n"
      "VOCABULARY = @seqio.PassThroughVocabulary()\n"
      "seqio.PassThroughVocabulary.size = 64\n"
      "seqio.PassThroughVocabulary.eos_id = 1\n"
      "utils.DatasetConfig.split = 'validation'\n"
      "utils.DatasetConfig.batch_size = 4\n")
  bindings = [
      "MIXTURE_OR_TASK_NAME='specdec_tiny_copy'",
      "MIXTURE_OR_TASK_MODULE='tests.t5x.tiny_task'",
      "TASK_FEATURE_LENGTHS={'inputs': 8, 'targets': 8}",
      f"CHECKPOINT_PATH='{ckpt}'", f"INFER_OUTPUT_DIR='{out}'",
      "DRAFTER='t5_tiny'", "VERIFIER='t5_tiny'", "COMPUTE_DTYPE='float32'",
      "METHOD='spec_decode'", "METHOD_KNOBS={}", "GAMMA=3"]
  cmd = [sys.executable, "-m", "t5x.infer", f"--gin_search_paths={GIN_DIR}",
         "--gin_file=t5x/spec_cascade_infer.gin",
         f"--gin_file={tmp_path / 'vocab.gin'}"] + [
             f"--gin_bindings={b}" for b in bindings]
  proc = subprocess.run(cmd, env=env, cwd=root, capture_output=True,
                        text=True, timeout=900, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  (path,) = [p for p in glob.glob(str(out / "specdec_tiny_copy-*.jsonl*"))
             if not p.endswith(".COMPLETED")]
  with open(path) as f:
    rows = [json.loads(line) for line in f]
  ids = tiny_task.examples()
  src = np.concatenate([ids, np.ones((len(ids), 1), np.int32)], axis=1)
  ref = decoding.generate(decoding.TargetOnly(), drafter, verifier, qp, pp,
                          inputs=src, max_new_tokens=8)
  assert len(rows) == len(ids)  # in the task's order (no shuffling)

  def clean(tokens):  # up to EOS, without padding
    tokens = [int(t) for t in tokens]
    return tokens[:tokens.index(1)] if 1 in tokens else [
        t for t in tokens if t != 0]
  for i, r in enumerate(rows):
    assert clean(r["prediction"]) == clean(ref.tokens[i][:ref.lengths[i]]), i
    assert r["aux"]["tokens"] == ref.lengths[i]
