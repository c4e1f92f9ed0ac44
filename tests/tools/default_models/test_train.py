"""The training loop: batches, exact loss, learning, determinism, resume."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import models
from tools.default_models import train

EOS = 1


@functools.lru_cache(maxsize=None)
def tiny(name):
  return models.get_model(name)


@functools.lru_cache(maxsize=None)
def _raw_params(name):
  """Random numpy parameters of the right shapes.

  (``model.init_params`` runs op by op and takes tens of seconds on a busy
  CPU; the loop does not care how the parameters were drawn.) Norm scales
  are neutral: 1 for T5, 0 for Gemma's ``1 + scale``.
  """
  model = tiny(name)
  rng = np.random.default_rng(0)
  neutral = 1.0 if model.is_encoder_decoder else 0.0
  return jax.tree.map(
      lambda x: (rng.normal(0, 0.3, x.shape) if len(x.shape) > 1 else
                 np.full(x.shape, neutral)).astype(np.float32),
      model.param_shapes())


def fresh_params(name):
  """train.init_params(model, seed=0), as new device arrays."""
  params = jax.tree.map(jnp.array, _raw_params(name))
  return train.scale_t5_queries(tiny(name), params)


def lm_rows():
  # Four fixed "prompt -> continuation" rows (vocab 64, BOS 2).
  return [([2, 10, 11, 12], [13, 14]), ([2, 20, 21], [22, 23, 24]),
          ([2, 30], [31, 32, 33, 34]), ([2, 40, 41, 42, 43], [44])]


def s2s_rows():
  return [([10, 11, 12, EOS], [13, 14]), ([20, 21, EOS], [22, 23, 24]),
          ([30, EOS], [31, 32, 33, 34]), ([40, 41, 42, 43, EOS], [44])]


def manual_loss(logits, targets, weights):
  """Weighted mean token cross-entropy in float64 numpy."""
  x = np.asarray(logits, np.float64)
  x = x - x.max(-1, keepdims=True)
  logp = x - np.log(np.exp(x).sum(-1, keepdims=True))
  nll = -np.take_along_axis(logp, np.asarray(targets)[..., None], -1)[..., 0]
  w = np.asarray(weights, np.float64)
  return float((nll * w).sum() / w.sum())


def test_config_errors():
  with pytest.raises(ValueError, match="steps must be >= 1, got 0"):
    train.TrainConfig(steps=0)
  with pytest.raises(ValueError, match=r"warmup_steps must be in \[0, "
                     r"shortest cycle = 10\), got 10"):
    train.TrainConfig(steps=10, warmup_steps=10)
  with pytest.raises(ValueError, match="learning_rate must be > 0"):
    train.TrainConfig(learning_rate=0.0)
  with pytest.raises(ValueError, match=r"cycle_lengths must sum to "
                     r"steps=10, got \(5, 4\)"):
    train.TrainConfig(steps=10, warmup_steps=1, cycle_lengths=(5, 4))
  with pytest.raises(ValueError, match=r"cycle_decay must be in \(0, 1\]"):
    train.TrainConfig(steps=10, warmup_steps=1, cycle_lengths=(5, 5),
                      cycle_decay=0.0)
  with pytest.raises(ValueError, match=r"shortest cycle = 4\), got 4"):
    train.TrainConfig(steps=10, warmup_steps=4, cycle_lengths=(6, 4))
  with pytest.raises(ValueError, match="patience must be >= 0"):
    train.TrainConfig(patience=-1)
  for bad in ((("query", 0.0),), (("query",),), ("query",)):
    with pytest.raises(ValueError, match=r"update_scales must be \(module "
                       r"name, factor > 0\) pairs"):
      train.TrainConfig(update_scales=bad)


def test_warm_restart_schedule():
  one = train.TrainConfig(steps=100, learning_rate=1e-3, warmup_steps=10,
                          end_lr_fraction=0.1)
  two = train.TrainConfig(steps=150, learning_rate=1e-3, warmup_steps=10,
                          end_lr_fraction=0.1, cycle_lengths=(100, 50),
                          cycle_decay=0.5)
  # Cycle 1 is the one-cycle schedule, so a one-cycle run can be continued.
  for step in range(0, 100, 7):
    assert train.learning_rate(two, step) == pytest.approx(
        train.learning_rate(one, step), rel=1e-6)
  assert train.learning_rate(two, 10) == pytest.approx(1e-3)
  assert train.learning_rate(two, 100) == pytest.approx(1e-4)  # restart
  assert train.learning_rate(two, 105) == pytest.approx(3e-4)  # warming up
  assert train.learning_rate(two, 110) == pytest.approx(5e-4)  # half peak
  assert train.learning_rate(two, 150) == pytest.approx(5e-5)


def test_seq2seq_batch_exact():
  b = train.seq2seq_batch([([5, 6, 7], [8, 9]), ([5], [8, 9, 10, 11])],
                          input_buckets=(4, 8), target_buckets=(4, 8),
                          eos_id=EOS)
  np.testing.assert_array_equal(b["inputs"], [[5, 6, 7, 0], [5, 0, 0, 0]])
  np.testing.assert_array_equal(b["targets"], [[8, 9, 1, 0, 0, 0, 0, 0],
                                               [8, 9, 10, 11, 1, 0, 0, 0]])
  np.testing.assert_array_equal(b["decoder_inputs"],
                                [[0, 8, 9, 1, 0, 0, 0, 0],
                                 [0, 8, 9, 10, 11, 1, 0, 0]])
  np.testing.assert_array_equal(b["weights"], [[1, 1, 1, 0, 0, 0, 0, 0],
                                               [1, 1, 1, 1, 1, 0, 0, 0]])
  # Too long for the last bucket: cut, EOS kept.
  b = train.seq2seq_batch([(list(range(3, 13)), list(range(3, 13)))], (4,),
                          (4,), EOS)
  np.testing.assert_array_equal(b["inputs"], [[3, 4, 5, 6]])
  np.testing.assert_array_equal(b["targets"], [[3, 4, 5, 1]])
  with pytest.raises(ValueError, match="at least one"):
    train.seq2seq_batch([], (4,), (4,), EOS)


def test_decoder_token_dropout_is_deterministic_and_keeps_start_and_padding():
  rows = [([5, 6, 7], list(range(10, 10 + n))) for n in (3, 9, 20, 30)] * 8
  b = train.seq2seq_batch(rows, (4, 8), (32,), EOS)
  d = train.decoder_token_dropout(b, 0.3, token_id=2, seed=7)
  dec, new = b["decoder_inputs"], d["decoder_inputs"]
  changed = new != dec
  # Only real history positions change (never the start token, never
  # padding), and they become the given id; the rest of the batch is as is.
  assert not changed[:, 0].any() and not (changed & (b["weights"] == 0)).any()
  np.testing.assert_array_equal(new[changed], 2)
  for k in ("inputs", "targets", "weights"):
    np.testing.assert_array_equal(d[k], b[k])
  eligible = (b["weights"] > 0).copy()
  eligible[:, 0] = False
  frac = changed.sum() / eligible.sum()
  assert 0.2 < frac < 0.4, frac  # 0.3 of ~500 positions
  # A function of the contents and the seed: same batch again (a resumed
  # stream) -> same corruption; another seed -> another one.
  again = train.decoder_token_dropout(dict(b), 0.3, token_id=2, seed=7)
  np.testing.assert_array_equal(again["decoder_inputs"], new)
  other = train.decoder_token_dropout(b, 0.3, token_id=2, seed=8)
  assert (other["decoder_inputs"] != new).any()
  assert train.decoder_token_dropout(b, 0.0, 2) is b
  with pytest.raises(ValueError, match=r"rate must be in \[0, 1\), got 1.0"):
    train.decoder_token_dropout(b, 1.0, 2)


def test_lm_batch_exact():
  b = train.lm_batch([([2, 5, 6], [7, 8]), ([2, 5], [7])], buckets=(4, 8),
                     eos_id=EOS, prompt_weight=0.5)
  np.testing.assert_array_equal(b["decoder_inputs"],
                                [[2, 5, 6, 7, 8, 1, 0, 0],
                                 [2, 5, 7, 1, 0, 0, 0, 0]])
  np.testing.assert_array_equal(b["targets"], [[5, 6, 7, 8, 1, 0, 0, 0],
                                               [5, 7, 1, 0, 0, 0, 0, 0]])
  np.testing.assert_array_equal(b["weights"],
                                [[0.5, 0.5, 1, 1, 1, 0, 0, 0],
                                 [0.5, 1, 1, 0, 0, 0, 0, 0]])
  assert "inputs" not in b


@pytest.mark.parametrize("name", ["gemma2_tiny", "t5_tiny"])
def test_first_step_loss_is_manual_cross_entropy(name):
  model = tiny(name)
  params = fresh_params(name)
  if model.is_encoder_decoder:
    batch = train.seq2seq_batch(s2s_rows(), (8,), (8,), EOS)
  else:
    batch = train.lm_batch(lm_rows(), (8,), EOS, prompt_weight=0.25)
  logits = jax.jit(model.forward)(params, batch["decoder_inputs"],
                                  inputs=batch.get("inputs"))
  want = manual_loss(logits, batch["targets"], batch["weights"])
  total, count = train.make_eval_step(model)(params, batch)
  assert float(count) == pytest.approx(batch["weights"].sum())
  assert float(total / count) == pytest.approx(want, rel=1e-5)
  cfg = train.TrainConfig(steps=10, warmup_steps=2)
  state = train.init_state(params, cfg)
  step = train.make_train_step(model, cfg)
  state, metrics = step(state, batch)
  assert float(metrics["loss"]) == pytest.approx(want, rel=1e-5)
  assert int(state.step) == 1
  # The warmup's first learning rate is 0: the parameters do not move.
  assert train.learning_rate(cfg, 0) == 0.0
  assert train.learning_rate(cfg, 2) == pytest.approx(1e-3)


@pytest.mark.parametrize("name", ["gemma2_tiny", "t5_tiny"])
def test_loss_decreases_on_repeated_data(name):
  model = tiny(name)
  if model.is_encoder_decoder:
    batch = train.seq2seq_batch(s2s_rows(), (8,), (8,), EOS)
  else:
    batch = train.lm_batch(lm_rows(), (8,), EOS)
  cfg = train.TrainConfig(steps=40, learning_rate=1e-2, warmup_steps=5,
                          log_every=10, eval_every=40)
  stream = lambda start: iter(lambda: batch, None)
  eval_step = train.make_eval_step(model)
  params = fresh_params(name)
  before = train.evaluate(eval_step, params, [batch])
  result = train.train(model, params, cfg, stream, [batch], log=None)
  after = train.evaluate(eval_step, result.params, [batch])
  assert after < 0.25 * before, (before, after)
  assert result.best_step == 40
  assert result.best_eval_loss == pytest.approx(after, rel=1e-5)
  logged = [h["loss"] for h in result.history if "loss" in h]
  assert len(logged) == 4 and logged[-1] < logged[0]


def test_scale_t5_queries_only():
  model = tiny("t5_tiny")
  raw = models.flatten_params(_raw_params("t5_tiny"))
  ours = models.flatten_params(fresh_params("t5_tiny"))
  scale = model.config.head_dim ** -0.5
  queries = [k for k in raw if k.endswith("query/kernel")]
  assert len(queries) == 6  # 2 encoder + 2 x 2 decoder attentions
  for k in raw:
    want = raw[k] * np.float32(scale) if k in queries else raw[k]
    np.testing.assert_allclose(ours[k], want, rtol=1e-6)
  gemma = _raw_params("gemma2_tiny")
  assert train.scale_t5_queries(tiny("gemma2_tiny"), gemma) is gemma


def test_update_scales_scale_only_the_named_modules_updates():
  """One AdamW step with ('query', 0.125): query kernels move exactly 1/8
  of the unscaled step (weight decay included), every other leaf the same."""
  params = fresh_params("t5_tiny")
  grads = jax.tree.map(lambda x: jnp.full_like(x, 0.3) * jnp.sign(x + 1e-3),
                       params)
  cfg = train.TrainConfig(steps=10, warmup_steps=0, learning_rate=1e-2,
                          weight_decay=0.1)
  scaled = dataclasses.replace(cfg, update_scales=(("query", 0.125),))

  def step(c):
    opt = train.make_optimizer(c)
    upd, _ = opt.update(grads, opt.init(params), params)
    return models.flatten_params(upd)
  plain, ours = step(cfg), step(scaled)
  queries = [k for k in plain if "/query/" in f"/{k}"]
  assert len(queries) == 6
  for k in plain:
    want = plain[k] * (0.125 if k in queries else 1.0)
    np.testing.assert_allclose(ours[k], want, rtol=1e-6, atol=0)
    assert np.abs(plain[k]).max() > 0
  path = [jax.tree_util.DictKey("decoder"), jax.tree_util.DictKey("query")]
  assert train.update_scale(scaled, path) == 0.125
  assert train.update_scale(cfg, path) == 1.0
  # The chain is AdamW's alone without scales (old train states resume).
  assert len(train.make_optimizer(cfg).init(params)) == 2


def test_on_eval_sees_every_evaluation_with_its_loss_and_params(tmp_path):
  model = tiny("t5_tiny")
  params = fresh_params("t5_tiny")
  cfg = train.TrainConfig(steps=6, warmup_steps=1, eval_every=2, log_every=2,
                          learning_rate=1e-2)
  batch = train.seq2seq_batch(s2s_rows(), (8,), (8,), EOS)
  seen = []
  result = train.train(model, params, cfg, lambda start: iter(
      lambda: batch, None), [batch], workdir=None, log=None,
      on_eval=lambda step, p, loss: seen.append((step, p, loss)))
  evals = [(h["step"], h["eval_loss"]) for h in result.history
           if "eval_loss" in h]
  assert [(s, l) for s, _, l in seen] == evals and len(evals) == 3
  best = min(range(3), key=lambda i: seen[i][2])
  for a, b in zip(jax.tree.leaves(seen[best][1]),
                  jax.tree.leaves(result.params)):
    np.testing.assert_array_equal(a, b)
  assert seen[0][2] != seen[-1][2]


def test_bucketed_stream_deterministic_resumable_and_sorted():
  items = [[0] * n for n in (5, 1, 9, 3, 7, 2, 8, 4, 6, 10)]
  make = lambda xs: {"lengths": np.array([len(x) for x in xs])}
  take = lambda it, n: [next(it)["lengths"].tolist() for _ in range(n)]
  full = take(train.bucketed_stream(items, make, 3, len, seed=7), 9)
  assert full == take(train.bucketed_stream(items, make, 3, len, seed=7), 9)
  assert take(train.bucketed_stream(items, make, 3, len, seed=7,
                                    start_step=4), 5) == full[4:]
  assert full != take(train.bucketed_stream(items, make, 3, len, seed=8), 9)
  for epoch in range(3):  # 3 batches per epoch, items never repeated in one
    got = sum(full[3 * epoch:3 * epoch + 3], [])
    assert len(set(got)) == 9
  # Inside a sorted window, batches hold neighbouring lengths.
  runs = sum(sorted(sorted(b) for b in full[:3]), [])
  assert runs == sorted(runs)
  with pytest.raises(ValueError, match="batch_size must be in"):
    next(train.bucketed_stream(items, make, 11, len, seed=0))


def resume_case():
  """(model, params, cfg, stream, evals) of a 6-step tiny Gemma run that
  checkpoints at step 3 (the resume tests)."""
  model = tiny("gemma2_tiny")
  rows = lm_rows() * 2
  make = lambda xs: train.lm_batch(xs, (8,), EOS)
  cfg = train.TrainConfig(steps=6, learning_rate=1e-2, warmup_steps=1,
                          eval_every=3, log_every=3)
  stream = lambda start: train.bucketed_stream(rows, make, 2, len, seed=0,
                                               start_step=start)
  return model, fresh_params("gemma2_tiny"), cfg, stream, [make(rows[:4])]


def test_resume_after_kill_matches_uninterrupted(tmp_path):
  model, params, cfg, stream, evals = resume_case()
  train.train(model, params, cfg, stream, evals, workdir=str(tmp_path / "a"),
              log=None)

  def dies_after_4(start):
    it = stream(start)
    for _ in range(4):
      yield next(it)
    raise KeyboardInterrupt("killed")

  with pytest.raises(KeyboardInterrupt):
    train.train(model, params, cfg, dies_after_4, evals,
                workdir=str(tmp_path / "b"), log=None)
  lines = []
  train.train(model, params, cfg, stream, evals, workdir=str(tmp_path / "b"),
              log=lines.append)
  assert lines[0] == f"resumed from {tmp_path / 'b'} at step 3"
  like = train.init_state(params, cfg)
  a = train.restore_state(str(tmp_path / "a"), like)
  b = train.restore_state(str(tmp_path / "b"), like)
  assert int(a[0].step) == int(b[0].step) == 6
  for x, y in zip(jax.tree.leaves(a[0]), jax.tree.leaves(b[0])):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6)
  # A state of another model is refused with a clear message.
  other = train.init_state(fresh_params("t5_tiny"), cfg)
  with pytest.raises(ValueError, match="another model or optimizer"):
    train.restore_state(str(tmp_path / "a"), other)


def test_patience_stops_after_evaluations_without_improvement(
    tmp_path, monkeypatch):
  """Scripted evaluation losses 3, 2, 2.5, 2.6, 1: with patience 2 the run
  stops after the 4th step (two evaluations without improving on step 2)
  and returns step 2's parameters; a resumed run stops at once."""
  model = tiny("gemma2_tiny")
  rows = lm_rows() * 2
  make = lambda xs: train.lm_batch(xs, (8,), EOS)
  scripted = iter([3.0, 2.0, 2.5, 2.6, 1.0])
  monkeypatch.setattr(train, "evaluate_objective",
                      lambda *a, **k: next(scripted))
  cfg = train.TrainConfig(steps=8, learning_rate=1e-2, warmup_steps=1,
                          eval_every=1, log_every=1, patience=2)
  stream = lambda start: train.bucketed_stream(rows, make, 2, len, seed=0,
                                               start_step=start)
  lines = []
  out = train.train(model, fresh_params("gemma2_tiny"), cfg, stream,
                    [make(rows[:4])], workdir=str(tmp_path), log=lines.append)
  assert out.best_step == 2 and out.best_eval_loss == 2.0
  assert [h["step"] for h in out.history if "eval_loss" in h] == [1, 2, 3, 4]
  assert lines[-1] == ("early stop at step 4: 2 evaluations without "
                       "improvement (best 2.0000 at 2)")
  best = train._load_tree(str(tmp_path / train.BEST_FILE), out.params)[0]  # pylint: disable=protected-access
  for x, y in zip(jax.tree.leaves(best), jax.tree.leaves(out.params)):
    np.testing.assert_array_equal(x, y)
  lines.clear()
  again = train.train(model, fresh_params("gemma2_tiny"), cfg, stream,
                      [make(rows[:4])], workdir=str(tmp_path),
                      log=lines.append)
  assert lines[1].startswith("early stop at step 4")
  assert again.best_step == 2
  assert next(scripted) == 1.0  # no further evaluation ran
  # Without patience the same losses run to the end.
  assert not cfg.out_of_patience(3, 2)
  assert not train.TrainConfig(patience=0).out_of_patience(10**6, 0)


def manual_kl(logits, teacher_idx, teacher_logp, weights):
  """Weighted mean KL(renormalised teacher top-k || student), float64."""
  x = np.asarray(logits, np.float64)
  x = x - x.max(-1, keepdims=True)
  logq = x - np.log(np.exp(x).sum(-1, keepdims=True))
  logq = np.take_along_axis(logq, np.asarray(teacher_idx), -1)
  t = np.asarray(teacher_logp, np.float64)
  logp = t - np.log(np.exp(t).sum(-1, keepdims=True))
  kl = (np.exp(logp) * (logp - logq)).sum(-1)
  w = np.asarray(weights, np.float64)
  return float((kl * w).sum() / w.sum())


def test_kl_to_teacher_hand_example():
  # Student uniform over 4 ids; teacher top-2 {0: log .5, 1: log .5}:
  # KL = sum_k .5 * (log .5 - log .25) = log 2 at each weighted position.
  logits = jnp.zeros((1, 2, 4))
  idx = jnp.array([[[0, 1], [2, 3]]])
  logp = jnp.log(jnp.full((1, 2, 2), 0.5))
  total, count = train.kl_to_teacher(logits, idx, logp,
                                     jnp.array([[1.0, 0.0]]))
  assert float(count) == 1.0
  assert float(total) == pytest.approx(np.log(2.0), rel=1e-6)
  # Teacher log-probs are renormalised over their k ids: scaling changes
  # nothing.
  total2, _ = train.kl_to_teacher(logits, idx, logp - 3.0,
                                  jnp.array([[1.0, 0.0]]))
  assert float(total2) == pytest.approx(float(total), rel=1e-6)


@pytest.mark.parametrize("name", ["gemma2_tiny", "t5_tiny"])
def test_distillation_loss_is_cross_entropy_plus_kl(name):
  model = tiny(name)
  params = fresh_params(name)
  if model.is_encoder_decoder:
    batch = train.seq2seq_batch(s2s_rows(), (8,), (8,), EOS)
  else:
    batch = train.lm_batch(lm_rows(), (8,), EOS)
  rng = np.random.default_rng(1)
  b, t = batch["targets"].shape
  batch = dict(batch,
               teacher_idx=rng.integers(0, 64, (b, t, 3)).astype(np.int32),
               teacher_logp=rng.normal(size=(b, t, 3)).astype(np.float32),
               kl_weights=(batch["weights"] > 0).astype(np.float32))
  batch["weights"][0] = 0.0  # a teacher-only row: KL, no cross-entropy
  logits = jax.jit(model.forward)(params, batch["decoder_inputs"],
                                  inputs=batch.get("inputs"))
  want = manual_loss(logits, batch["targets"], batch["weights"]) + \
      manual_kl(logits, batch["teacher_idx"], batch["teacher_logp"],
                batch["kl_weights"])
  got = train.evaluate_objective(train.make_terms_step(model), params, [batch])
  assert got == pytest.approx(want, rel=1e-5)
  cfg = train.TrainConfig(steps=10, warmup_steps=2)
  _, metrics = train.make_train_step(model, cfg)(  # donates its state
      train.init_state(jax.tree.map(jnp.array, params), cfg), batch)
  assert float(metrics["loss"]) == pytest.approx(want, rel=1e-5)
  # Without teacher fields the objective is the plain cross-entropy.
  plain = {k: v for k, v in batch.items() if k not in train.TEACHER_KEYS}
  assert train.evaluate_objective(
      train.make_terms_step(model), params, [plain]) == pytest.approx(
          manual_loss(logits, batch["targets"], batch["weights"]), rel=1e-5)


@pytest.mark.parametrize("name", ["gemma2_tiny", "t5_tiny"])
def test_teacher_topk_and_truncated_decoder(name):
  model = tiny(name)
  params = fresh_params(name)
  if model.is_encoder_decoder:
    batch = train.seq2seq_batch(s2s_rows(), (8,), (8,), EOS)
  else:
    batch = train.lm_batch(lm_rows(), (8,), EOS)
  logits = jax.jit(model.forward)(params, batch["decoder_inputs"],
                                  inputs=batch.get("inputs"))
  logp, ids = train.make_teacher_topk(model, 5)(params, batch)
  want = np.sort(np.asarray(jax.nn.log_softmax(logits, -1)), -1)[..., ::-1]
  np.testing.assert_allclose(np.asarray(logp), want[..., :5], rtol=1e-5,
                             atol=1e-6)
  assert ids.shape == logp.shape == batch["targets"].shape + (5,)
  # One decoder layer kept: equals the early-exit model on the full params.
  small, sp = train.truncate_decoder(model, params, 1)
  assert small.num_params() < model.num_params()
  got = jax.jit(small.forward)(sp, batch["decoder_inputs"],
                               inputs=batch.get("inputs"))
  ref = jax.jit(models.early_exit(model, 1).forward)(
      params, batch["decoder_inputs"], inputs=batch.get("inputs"))
  np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=1e-5,
                             atol=1e-5)
  with pytest.raises(ValueError, match=r"num_layers must be in \[1, 2\]"):
    train.truncate_decoder(model, params, 3)
