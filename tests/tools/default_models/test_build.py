"""The training script's resumable teacher passes (tools/default_models/build.py)."""

import dataclasses
import json
import os

import numpy as np
import pytest

from tests.tools.default_models import load_tool



def _script():
  return load_tool("build")


def test_a_saved_teacher_pass_is_reused_and_a_partial_one_is_not(tmp_path,
                                                                   capsys):
  script = _script()
  wd = str(tmp_path / "teacher")
  assert script._load_pass(wd, "train", "greedy", 2) is None
  saved = dict(preds=["a b", "c"], stats=dict(rows=2, mean_tokens=1.5,
                                               seconds=3.0))
  script._write_json(script._pass_path(wd, "train", "greedy"), saved)
  assert os.listdir(wd) == ["train_greedy_outputs.json"]  # no .tmp left
  assert script._load_pass(wd, "train", "greedy", 2) == saved
  assert script._load_pass(wd, "train", "sampled", 2) is None
  # A pass over a different number of examples (another corpus) is not used.
  assert script._load_pass(wd, "train", "greedy", 3) is None
  assert "2 outputs, expected 3" in capsys.readouterr().out
  with open(os.path.join(wd, "train_greedy_outputs.json")) as f:
    assert json.load(f)["preds"] == ["a b", "c"]


def _tiny_family(script, n: int = 6):
  """A Family over a tiny random T5 model whose vocabulary is the tiny
  tokenizer's (test_harness), so every generated id is a text piece."""
  import dataclasses
  import jax
  from specdec_jax import models
  from specdec_jax.families import loader as dm
  from tests.eval.test_harness import stand_in_examples, train_tokenizer
  tok = train_tokenizer("t5")
  model = models.model_from_config(dataclasses.replace(
      models.get_model("t5_tiny").config, vocab_size=tok.vocab_size))
  params = model.init_params(jax.random.PRNGKey(0))
  for name, layer in params["decoder"].items():  # varied greedy outputs
    if name.startswith("layers_"):
      for w in layer["mlp"].values():
        w["kernel"] = w["kernel"] * 3.0
  fam = script.Family(task="t5_docstring", spec=dm.TASKS["t5_docstring"],
                      tok=tok, train_rows=[], val_rows=[],
                      examples={"train": stand_in_examples(n, seed=3)})
  return fam, model, params


def test_output_pass_is_the_models_greedy_rollout_and_is_reused(
    tmp_path, monkeypatch):
  """The on-policy pass (a student's own greedy outputs on the training
  inputs) returns the model's greedy rollout as text re-encoded to target
  ids, stats count the rows, and a second call reads the saved pass instead
  of decoding."""
  from specdec_jax import decoding
  from specdec_jax.families import loader as dm
  from tools.default_models import family_eval as dme
  from tools.default_models import distill as distill_lib
  script = _script()
  fam, model, params = _tiny_family(script)
  wd = str(tmp_path / "small")
  ids, stats = script._output_pass(fam, model, params, wd, "train",
                                   "student_greedy", decoding.Greedy(),
                                   "small")
  assert stats["rows"] == 6 and len(ids) == 6
  # The rollout itself, checked against teacher forcing (independent of the
  # decode loop): every generated id is the model's top-1 after the ids
  # before it, up to the budget or EOS.
  examples = fam.examples["train"]
  pair = dm.DefaultPair(fam.task, model, model, params, params, fam.tok,
                        fam.spec.metrics, fam.spec.max_new_tokens, True,
                        fam.spec)
  _, out = pair.generate(decoding.make_method("target_only"), examples,
                         verifier="large")
  raw = [[int(t) for t in s] for s in out.sequences()]
  raw = [r[:r.index(fam.tok.eos_id)] if fam.tok.eos_id in r else r
         for r in raw]
  assert sum(len(r) for r in raw) > 6 * 4
  inputs = [dm.encode_inputs(fam.tok, fam.spec, ex["inputs"])
            for ex in examples]
  forced = distill_lib.teacher_rows(
      model, params, [(x, r[:fam.spec.max_target_tokens - 1])
                      for x, r in zip(inputs, raw)],
      [False] * 6, dme.batch_maker(fam.spec, fam.tok.eos_id), "t5", k=1)
  for row, r in zip(forced, raw):
    n = min(len(r), fam.spec.max_target_tokens - 1)
    assert [int(t) for t in row.teacher_idx[:n, 0]] == r[:n]
  # ... and the pass returns it as text, re-encoded to training targets.
  assert ids == [dm.encode_targets(fam.tok, fam.spec, fam.tok.decode(r))
                 for r in raw]
  with open(script._pass_path(wd, "train", "student_greedy")) as f:
    saved = json.load(f)
  assert saved["stats"] == stats and len(saved["preds"]) == 6

  def no_decode(*a, **k):
    raise AssertionError("the saved pass should have been reused")

  monkeypatch.setattr(dme, "decode", no_decode)
  again, stats2 = script._output_pass(fam, model, params, wd, "train",
                                      "student_greedy", decoding.Greedy(),
                                      "small")
  assert again == ids and stats2 == stats


def _tiny_pretraining(tmp_path):
  """(corpus, pretraining corpus): one stdlib-like module and 6 pip-like
  packages of one documented function each."""
  from specdec_jax.families import corpus as corpus_lib
  from tools.default_models import pretraining
  from tests.families.test_corpus import MOD, write
  root = str(tmp_path / "lib")
  write(root, "pkg/shapes.py", MOD)
  site = str(tmp_path / "site")
  for i in range(6):
    write(site, f"p{i}/m.py", f'def f{i}(a):\n    """Return the value '
          f'number {i} of a.\n    """\n    b = a + {i}\n    return b\n' +
          "# padding\n" * 60)
  corpus = corpus_lib.build(root)
  return corpus, pretraining.build(corpus, site)


def test_extra_examples_leave_out_used_inputs_and_are_a_fixed_subset(
    tmp_path, monkeypatch):
  from tools.default_models import pretraining
  corpus, pre = _tiny_pretraining(tmp_path)
  script = _script()
  task = "gemma_completion"
  train = corpus.examples[task]["train"]
  fam = script.Family(task=task, spec=None, tok=None, train_rows=[],
                      val_rows=[], examples={"train": train}, pre=pre)
  every = script.extra_examples(fam, corpus, smoke=False)
  used = pretraining.held_out_inputs(corpus) | {e["inputs"] for e in train}
  assert len(every) >= 6 and not any(e["inputs"] in used for e in every)
  assert sorted(e["inputs"] for e in every) == sorted(
      e["inputs"] for e in pretraining.task_examples(pre, task, used))
  monkeypatch.setattr(script.plan, "EXTRA_INPUTS", 3)
  some = script.extra_examples(fam, corpus, smoke=False)
  assert len(some) == 3 and all(e in every for e in some)
  assert some == script.extra_examples(fam, corpus, smoke=False)


def test_t5_pretraining_mixes_prefix_lm_pairs_only_into_the_drafters(
    tmp_path, monkeypatch):
  """T5: every size pretrains on the pretraining files' docstring examples;
  the sizes in plan.PREFIX_LM_LEVELS (the drafters) get as many prefix-LM
  pairs on top (96 ids -> the next 24 of the token stream), the large one
  none (it then reads its task inputs, see the plan)."""
  from specdec_jax.families import loader as dm
  from tools.default_models import family_eval as dme
  from tools.default_models import pretraining
  from tests.eval.test_harness import train_tokenizer
  corpus, pre = _tiny_pretraining(tmp_path)
  script = _script()
  task = "t5_docstring"
  assert script.plan.PREFIX_LM_LEVELS[task] == ("medium", "small")
  spec, tok = dm.TASKS[task], train_tokenizer("t5")
  fam = script.Family(task=task, spec=spec, tok=tok, train_rows=[],
                      val_rows=[], examples={}, pre=pre)
  wd = str(tmp_path / "work")
  docs = dme.tokenize(tok, spec, pretraining.docstring_examples(
      pre, pretraining.held_out_inputs(corpus)))
  assert len(docs) >= 6
  large, _ = script.pretrain_data(fam, corpus, wd, "large")
  assert large == docs
  small, make = script.pretrain_data(fam, corpus, wd, "small")
  assert small[:len(docs)] == docs and len(small) == 2 * len(docs)
  stream = np.load(os.path.join(wd, task, "pretrain_tokens.npz"))["stream"]
  for inputs, targets in small[len(docs):]:
    assert len(inputs) == script.plan.PREFIX_LM[task][0] + 1
    assert inputs[-1] == tok.eos_id and len(targets) == 24
    text = list(stream.astype(int))
    s = next(i for i in range(len(text)) if text[i:i + 96] == inputs[:-1])
    assert text[s + 96:s + 120] == targets  # the next 24 ids
  assert script.pretrain_data(fam, corpus, wd, "medium")[0] is small
  # The mix follows the plan: with no T5 size listed, none gets pairs.
  monkeypatch.setitem(script.plan.PREFIX_LM_LEVELS, task, ())
  fam.pretrain_items = {}
  assert script.pretrain_data(fam, corpus, wd, "small")[0] == docs
  batch = make(small[:2])
  assert batch["targets"].shape[0] == 2


def test_t5_codegen_pretrains_every_size_on_code_pairs_and_long_prefix_lm(
    tmp_path):
  """'t5_codegen': every size pretrains on the pretraining files' completion
  examples (signature + docstring -> body lines) plus as many prefix-LM
  pairs of 64 ids -> the next 127 (long decoder targets: code LM)."""
  from specdec_jax.families import loader as dm
  from tools.default_models import family_eval as dme
  from tools.default_models import pretraining
  from tests.eval.test_harness import train_tokenizer
  corpus, pre = _tiny_pretraining(tmp_path)
  script = _script()
  task = "t5_codegen"
  assert script.plan.PREFIX_LM_LEVELS[task] == ("large", "medium", "small")
  n_in, n_out = script.plan.PREFIX_LM[task]
  assert (n_in, n_out) == (64, 127)
  spec, tok = dm.TASKS[task], train_tokenizer("t5")
  fam = script.Family(task=task, spec=spec, tok=tok, train_rows=[],
                      val_rows=[], examples={}, pre=pre)
  wd = str(tmp_path / "work")
  exs = pretraining.task_examples(pre, task,
                                  pretraining.held_out_inputs(corpus))
  assert exs == pretraining.task_examples(pre, "gemma_completion",
                                          pretraining.held_out_inputs(corpus))
  docs = dme.tokenize(tok, spec, exs)
  assert len(docs) >= 6
  large, make = script.pretrain_data(fam, corpus, wd, "large")
  assert large[:len(docs)] == docs and len(large) == 2 * len(docs)
  assert script.pretrain_data(fam, corpus, wd, "small")[0] is large
  text = list(np.load(os.path.join(wd, task, "pretrain_tokens.npz"))[
      "stream"].astype(int))
  for inputs, targets in large[len(docs):]:
    assert len(inputs) == n_in + 1 and inputs[-1] == tok.eos_id
    assert len(targets) == n_out
    assert any(text[i:i + n_in] == inputs[:-1] and
               text[i + n_in:i + n_in + n_out] == targets
               for i in range(len(text)))  # the next 127 ids
  # A batch of prefix-LM pairs keeps all 127 targets + EOS (bucket 128).
  batch = make(large[len(docs):len(docs) + 2])
  assert batch["targets"].shape == (2, 128)
  assert (batch["targets"][:, -1] == tok.eos_id).all()


def test_evaluate_family_on_a_tiny_three_size_family():
  """dme.evaluate_family (the report's numbers) on tiny random models:
  SpecDecode equals target-only for every pair, acceptance is accepted /
  drafted and alpha is accepted / (accepted + rejections), as a direct
  ``generate`` measures them."""
  import dataclasses
  from specdec_jax import decoding, models
  from specdec_jax.families import loader as dm
  from tools.default_models import family_eval as dme
  from tests.decoding.pairs import _noisy  # pylint: disable=protected-access
  script = _script()
  fam, large, lp = _tiny_family(script)
  small_cfg = dataclasses.replace(large.config, num_decoder_layers=1)
  small = models.model_from_config(small_cfg)
  sp = dict(lp, decoder={k: v for k, v in lp["decoder"].items()
                         if k != "layers_1"})
  sp = _noisy(sp, 2, 0.3)
  medium_p = _noisy(lp, 3, 0.1)
  pair = dm.DefaultPair(fam.task, small, large, sp, lp, fam.tok,
                        fam.spec.metrics, 12, True, fam.spec,
                        medium=large, m_params=medium_p)
  exs = fam.examples["train"]
  rep = dme.evaluate_family(pair, exs, batch_size=8)
  assert set(rep["levels"]) == set(dm.LEVELS)
  keys = {f"{q}>{p}" for q, p in dme.ACCEPTANCE_PAIRS}
  assert set(rep["acceptance"]) == set(rep["alpha"]) == keys
  assert all(v == 1.0 for v in rep["spec_equals_target"].values())
  _, out = pair.generate(decoding.make_method("spec_decode"), exs,
                         drafter="small", verifier="large", gamma=dme.GAMMA,
                         request_ids=list(range(len(exs))))
  a, d = out.accepted.sum(), out.drafted.sum()
  r = out.level_rejected[:, -1].sum()
  assert 0 < a < d and r > 0
  assert rep["acceptance"]["small>large"] == round(a / d, 5)
  assert rep["alpha"]["small>large"] == round(a / (a + r), 5)
  assert rep["alpha"]["small>large"] > rep["acceptance"]["small>large"]


def test_plan_stages_keep_by_metric_and_the_large_stages_stop_early():
  plan = _script().plan
  t5, gemma = (plan.stage(t, "large") for t in ("t5_docstring",
                                                 "gemma_completion"))
  assert (t5.keep, gemma.keep) == ("metric", "metric")
  assert t5.config.patience == gemma.config.patience == 8
  # Smoke runs keep the choice.
  assert plan.stage("t5_docstring", "large", smoke=True).keep == "metric"
  assert plan.describe()["stages"]["t5_docstring/large"]["keep"] == "metric"
  import pytest
  with pytest.raises(ValueError, match="keep must be one of"):
    plan.Stage(t5.config, 8, keep="final")


def test_t5_codegen_stages_scale_the_query_updates_by_head_dim():
  """Every t5_codegen stage scales the query kernel's updates by its
  model's 1/sqrt(head_dim); the other families' stages do not, and the
  schedules are otherwise t5_docstring's (but for the large's patience and
  the large_distill stage, which only t5_codegen has)."""
  plan = _script().plan
  for (task, name), st in plan.STAGES.items():
    scales = st.config.update_scales
    if task != "t5_codegen":
      assert scales == (), (task, name)
      continue
    head_dim = plan.ARCHS[task][name.split("_")[0]].head_dim
    assert scales == (("query", head_dim ** -0.5),), name
    if name == "large_distill":  # t5_codegen's own stage (no twin)
      assert st.keep == "metric" and st.config.steps == 1500
      continue
    twin = plan.STAGES[("t5_docstring", name)]
    # The medium's one round runs longer (its 'more' rows, MORE_INPUTS).
    steps = 4500 if name == "medium" else twin.config.steps
    got = dataclasses.replace(st.config, update_scales=(), steps=steps,
                              patience=twin.config.patience)
    assert got == dataclasses.replace(twin.config, steps=steps), name
  assert ("t5_codegen", "medium_onpolicy") not in plan.STAGES
  assert plan.stage("t5_codegen", "small").config.update_scales[0][1] == (
      32 ** -0.5)
  described = plan.describe()["stages"]["t5_codegen/large_pretrain"]
  assert json.loads(json.dumps(described))["update_scales"] == [
      ["query", 0.125]]


def test_decoder_dropout_is_validated_recorded_and_applied():
  import pytest
  script = _script()
  plan = script.plan
  base = plan.stage("t5_docstring", "large_pretrain")
  with pytest.raises(ValueError, match=r"decoder_dropout must be in \[0, 1\)"):
    plan.Stage(base.config, 8, decoder_dropout=1.0)
  st = plan.Stage(base.config, 32, decoder_dropout=0.25)
  plan.STAGES[("t5_docstring", "large_pretrain")] = st
  try:
    smoke = plan.stage("t5_docstring", "large_pretrain", smoke=True)
    assert smoke.decoder_dropout == 0.25 and smoke.batch_size == 8
    assert plan.describe()["stages"]["t5_docstring/large_pretrain"][
        "decoder_dropout"] == 0.25
  finally:
    plan.STAGES[("t5_docstring", "large_pretrain")] = base
  # The stage's batch maker: word dropout with the stage's seed.
  rows = [([5, 6, 7], list(range(10, 30)))] * 8
  make = lambda r: script.train_lib.seq2seq_batch(r, (8,), (32,), 1)
  got = script._with_decoder_dropout(make, 0.25, 2, 7, rows)
  want = script.train_lib.decoder_token_dropout(make(rows), 0.25, 2, 7)
  np.testing.assert_array_equal(got["decoder_inputs"],
                                want["decoder_inputs"])
  assert (got["decoder_inputs"] == 2).any()


def test_choose_by_metric_keeps_the_better_greedy_metric(tmp_path,
                                                          monkeypatch):
  """Each candidate is saved as shipped and checked; the better primary
  metric wins (loops lower ROUGE-2, so a looping best-loss step loses), the
  best-loss candidate (listed first) wins a tie."""
  script = _script()
  fam = script.Family(task="t5_docstring",
                      spec=script.dm.TASKS["t5_docstring"], tok=None,
                      train_rows=[], val_rows=[], examples={})
  saved, scores = [], {"candidate_150": 3.31, "candidate_550": 4.56}
  monkeypatch.setattr(script, "save_model",
                      lambda out, model, params: saved.append(
                          (os.path.basename(out), params)))
  checked = []

  def check(fam, out, examples=None):
    checked.append(examples)
    return dict(rouge2=scores[os.path.basename(out)],
                repetition_loop_fraction=0.0)

  monkeypatch.setattr(script, "check_large", check)
  params, step, checks = script.choose_by_metric(
      fam, None, {150: "p150", 550: "p550"}, str(tmp_path))
  assert (params, step) == ("p550", 550)
  assert saved == [("candidate_150", "p150"), ("candidate_550", "p550")]
  assert checks["150"]["rouge2"] == 3.31 and checks["550"]["rouge2"] == 4.56
  scores["candidate_550"] = 3.31
  assert script.choose_by_metric(fam, None, {150: "a", 550: "b"},
                                 str(tmp_path))[:2] == ("a", 150)
  # The examples checked are passed through (large_distill: the whole
  # validation split); by default check_large's own.
  script.choose_by_metric(fam, None, {150: "a"}, str(tmp_path), ["e"])
  assert checked == [None] * 4 + [["e"]]


def test_metric_within_considers_the_steps_near_the_best_loss():
  """keep='metric_within': the candidates are the evaluated steps within
  the tolerance of the lowest validation loss, lowest loss first (the
  seventh build's large: 550 is out, 300 in)."""
  script = _script()
  losses = {50: 2.6999, 100: 2.7257, 150: 2.6975, 200: 2.6999, 250: 2.7385,
            300: 2.7167, 350: 2.7388, 400: 2.8018, 550: 2.8687}
  assert script.steps_within(losses, 0.05) == [150, 50, 200, 300, 100, 250,
                                               350]
  assert script.steps_within(losses, 0.001) == [150]
  assert script.steps_within({10: 1.0, 5: 1.0}, 0.0) == [5, 10]
  plan = script.plan
  st = plan.stage("t5_codegen", "large")
  assert (st.keep, st.loss_tolerance) == ("metric_within", 0.05)
  assert st.config.patience == plan.CODEGEN_PATIENCE == 4
  assert plan.stage("gemma_completion", "large").loss_tolerance == 0.0
  import pytest
  for keep, tol in (("metric_within", 0.0), ("metric", 0.05),
                    ("metric_within", -1.0)):
    with pytest.raises(ValueError, match="loss_tolerance must be > 0 with "
                       "keep='metric_within' and 0 otherwise"):
      plan.Stage(st.config, 8, keep=keep, loss_tolerance=tol)


def test_report_table_shows_alpha_and_accepted_over_drafted():
  """The report's family table: per size, cost ratio, losses, metrics,
  loops, and acceptance vs the large model as 'alpha (accepted/drafted)'."""
  plan = _script().plan
  cost = {lv: dict(params=p, step_flops_xla=f, step_ms=m) for lv, p, f, m in
          (("small", 10, 1e6, 0.1), ("medium", 40, 4e6, 0.3),
           ("large", 160, 1.2e7, 0.9))}
  levels = {lv: dict(validation_loss=v, loss=v + 0.1, bleu=b,
                     repetition_loop_fraction=r)
            for lv, v, b, r in (("small", 3.0, 5.0, 0.1),
                                ("medium", 2.5, 9.0, 0.05),
                                ("large", 2.4, 10.0, 0.02))}
  keys = ("small>large", "medium>large", "small>medium")
  ev = dict(examples=7, levels=levels, cost=cost,
            acceptance=dict(zip(keys, (0.276, 0.43, 0.339))),
            alpha=dict(zip(keys, (0.61, 0.739, 0.673))),
            tokens_per_call=dict(zip(keys, (2.1, 2.8, 2.4))),
            spec_equals_target=dict.fromkeys(keys, 1.0),
            **{"acceptance_t1_small>large": 0.2})
  meta = dict(command="x", python="3", jax="j", machine="m",
              corpus=dict(stdlib_root="/s", corpus_hash="h" * 16),
              pretraining=dict(g=dict(files=[1], max_bytes=2**20,
                                      files_hash="f" * 16)),
              pairs=dict(g=dict(evaluation=ev, stages={},
                                task=dict(metrics=["bleu"],
                                          max_new_tokens=8))))
  text = plan.report_markdown(meta)
  assert "| small | 10 | 1.00 M | 12.0x | 3.000 | 3.100 | 5.00 | 10.0% | " \
         "0.610 (0.276) | 0 |" in text
  assert "| medium | 40 | 4.00 M | 3.0x | 2.500 | 2.600 | 9.00 | 5.0% | " \
         "0.739 (0.430) | 0 |" in text
  assert "| large | 160 | 12.00 M | 1.0x | 2.400 | 2.500 | 10.00 | 2.0% | " \
         "- | 0 |" in text
  assert "Leviathan et al. (Table 2)" in text
  # Training time per size: its own stages (the large's self-distillation
  # included).
  meta["pairs"]["g"]["stages"] = {
      "large_pretrain": dict(train_seconds=100.0),
      "large": dict(train_seconds=20.0),
      "large_distill": dict(train_seconds=30.0),
      "small": dict(train_seconds=7.0), "teacher": dict(wall_seconds=9.0)}
  text = plan.report_markdown(meta)
  assert "| large | 160 | 12.00 M | 1.0x | 2.400 | 2.500 | 10.00 | 2.0% | " \
         "- | 150 |" in text
  assert "0.610 (0.276) | 7 |" in text


def _corpus_family(script, corpus, pre, out: str, task: str, family: str):
  """A Family of ``task`` over the tiny corpus (train / validation / test
  splits; a tokenizer trained into ``out``), without extra inputs yet."""
  from specdec_jax.families import loader as dm
  from tests.eval.test_harness import train_tokenizer
  path = os.path.join(out, task, dm.TOKENIZER)
  os.makedirs(os.path.dirname(path))
  tok = train_tokenizer(family, path=path)
  spec = dm.TASKS[task]
  exs = {s: corpus.examples[task][s] for s in ("train", "validation",
                                               "test")}
  return script.Family(task, spec, tok,
                       script.dme.tokenize(tok, spec, exs["train"]),
                       script.dme.tokenize(tok, spec, exs["validation"]),
                       exs, pre=pre)


def test_a_data_bundle_gives_another_machine_the_same_training_data(
    tmp_path, capsys):
  """--export_data writes what the stages read; --data rebuilds the same
  families from it with no corpus: examples, token rows, every size's
  pretraining items (T5 pairs, Gemma stream windows) and the pretraining
  record. Wrong use gets a clear error."""
  import argparse
  import pytest
  from specdec_jax.families import loader as dm
  from tests.eval.test_harness import train_tokenizer
  corpus, pre = _tiny_pretraining(tmp_path)
  script = _script()
  out, wd, dest = (str(tmp_path / d) for d in ("out", "work", "bundle"))
  fams = {}
  for task, family in (("t5_codegen", "t5"), ("gemma_completion", "gemma")):
    fam = _corpus_family(script, corpus, pre, out, task, family)
    exs = fam.examples
    exs["extra"] = script.extra_examples(fam, corpus, smoke=False)
    if script.plan.more_inputs(task):
      exs["more"] = script.extra_examples(fam, corpus, False, "more")
    fams[task] = fam
  assert "more" in fams["t5_codegen"].examples  # (plan.MORE_INPUTS)
  assert "more" not in fams["gemma_completion"].examples
  args = argparse.Namespace(workdir=wd, out=out, export_data=dest, data="",
                            smoke=False, pretrain_bytes=2**20, force=False)
  script.export_bundle(args, fams, corpus)
  info = script.bundle_lib.read_info(dest)
  assert sorted(info["tasks"]) == ["gemma_completion", "t5_codegen"]
  assert info["smoke"] is False and info["corpus_hash"] == corpus.corpus_hash
  # Another machine: a fresh out directory, no corpus.
  out2 = str(tmp_path / "out2")
  args2 = argparse.Namespace(workdir=str(tmp_path / "work2"), out=out2,
                             data=dest, smoke=False, pretrain_bytes=2**20)
  got = script.families_from_bundle(args2, list(fams))
  for task, fam in fams.items():
    new = got[task]
    assert new.examples == fam.examples and new.pre is None
    assert new.train_rows == fam.train_rows and new.val_rows == fam.val_rows
    assert new.tok.fingerprint == fam.tok.fingerprint
    assert new.pretraining_record(1) == fam.pretraining_record(2**20)
    for level in dm.LEVELS:
      want, make = script.pretrain_data(fam, corpus, wd, level)
      have, make2 = script.pretrain_data(new, None, args2.workdir, level)
      assert have == want, (task, level)
      b1, b2 = make(want[:2]), make2(have[:2])
      assert all((b1[k] == b2[k]).all() for k in b1)
  assert not os.path.exists(os.path.join(args2.workdir, "t5_codegen",
                                         "pretrain_tokens.npz"))
  # Errors: a smoke mismatch, a task not exported, a clashing tokenizer,
  # a directory that is no bundle.
  with pytest.raises(SystemExit, match="exported without --smoke"):
    script.families_from_bundle(argparse.Namespace(**{**vars(args2),
                                                      "smoke": True}),
                                ["t5_codegen"])
  with pytest.raises(SystemExit, match="has no task 't5_docstring'"):
    script.families_from_bundle(args2, ["t5_docstring"])
  other = train_tokenizer("gemma", path=str(tmp_path / "other.model"))
  del other
  with open(os.path.join(out2, "t5_codegen", dm.TOKENIZER), "wb") as f:
    f.write(open(str(tmp_path / "other.model"), "rb").read())
  with pytest.raises(SystemExit, match="differs from the data bundle"):
    script.families_from_bundle(args2, ["t5_codegen"])
  with pytest.raises(ValueError, match="not a data bundle"):
    script.bundle_lib.read_info(str(tmp_path))


def test_large_distill_trains_the_finetuned_large_into_the_verifier(
    tmp_path, monkeypatch):
  """A self-distilling task: the large stage's model stays in the workdir
  (self_teacher's), large_distill trains it on self_teacher's rows into the
  shipped verifier, and a finished stage is not trained again."""
  import types
  from specdec_jax.checkpoints import native
  from specdec_jax.families import loader as dm
  from tools.default_models import family_eval as dme
  from tools.default_models import distill as distill_lib
  from tests.eval.test_harness import stand_in_examples
  script = _script()
  plan = load_tool("plan")
  assert script.self_distills("t5_codegen")
  assert not script.self_distills("gemma_completion")
  fam, model, params = _tiny_family(script, n=8)
  fam = dataclasses.replace(fam, task="t5_codegen", examples=dict(
      fam.examples, validation=stand_in_examples(4, seed=5)))
  args = types.SimpleNamespace(workdir=str(tmp_path / "wd"),
                               out=str(tmp_path / "out"), force=False,
                               smoke=True, smoke_steps=2)
  tuned = script.finetuned_dir(args, "t5_codegen")
  assert tuned == os.path.join(args.workdir, "t5_codegen", "large", "model")
  assert script.finetuned_dir(args, "gemma_completion") == os.path.join(
      args.out, "gemma_completion", dm.LEVEL_DIRS["large"])
  with pytest.raises(RuntimeError, match="t5_codegen/large_distill needs "
                     "the finished 'large' stage"):
    script.stage_large_distill(fam, args, None)
  script.save_model(tuned, model, params)
  tdir = os.path.join(args.workdir, "t5_codegen", "self_teacher")
  pairs = [(dm.encode_inputs(fam.tok, fam.spec, e["inputs"]),
            dm.encode_targets(fam.tok, fam.spec, e["targets"]))
           for e in fam.examples["train"]]
  rows = distill_lib.teacher_rows(
      model, params, pairs, [True, False] * 4,
      dme.batch_maker(fam.spec, fam.tok.eos_id), "t5", k=4)
  distill_lib.save_rows(os.path.join(tdir, "train.npz"), rows)
  distill_lib.save_rows(os.path.join(tdir, "validation.npz"), rows[:4])
  for stage in ("large", "self_teacher"):
    script.mark_done(os.path.join(args.workdir, "t5_codegen", stage), {})
  with open(os.path.join(tuned, native.PARAMS), "rb") as f:
    tuned_bytes = f.read()
  report = script.stage_large_distill(fam, args,
                                      script.Progress(args.workdir))
  assert report["steps_run"] == 2 and report["batch_size"] == 8
  assert report["kept_step"] == 2  # best = last: nothing to choose
  assert report["check"]["examples"] == 4
  assert [list(x) for x in report["train_config"]["update_scales"]] == [
      ["query", plan.ARCHS["t5_codegen"]["large"].head_dim ** -0.5]]
  shipped = os.path.join(args.out, "t5_codegen", dm.LEVEL_DIRS["large"])
  _, new = native.load(shipped, dtype="float32")
  _, old = native.load(tuned, dtype="float32")
  with open(os.path.join(tuned, native.PARAMS), "rb") as f:
    assert f.read() == tuned_bytes  # the teacher's model is left as it was
  import jax
  diffs = jax.tree_util.tree_leaves(jax.tree_util.tree_map(
      lambda a, b: float(np.abs(a - b).max()), new, old))
  assert max(diffs) > 0  # trained
  monkeypatch.setattr(script, "run_training", lambda *a, **k: 1 / 0)
  assert script.stage_large_distill(fam, args, None)["steps_run"] == 2


def test_the_teacher_writes_a_more_split_that_only_the_listed_levels_learn(
    tmp_path, monkeypatch):
  """plan.MORE_INPUTS: the teacher stage writes its greedy rows on the
  'more' inputs (teacher-only: no data loss), a rerun reuses every saved
  split's rows, the levels of plan.MORE_ROWS_LEVELS (the t5_codegen medium)
  train on them and the others do not, and a level without an
  '<level>_onpolicy' stage has no on-policy round."""
  import types
  from specdec_jax.families import loader as dm
  from tools.default_models import family_eval as dme
  from tools.default_models import distill as distill_lib
  from tests.eval.test_harness import stand_in_examples
  script = _script()
  plan = script.plan
  assert plan.MORE_ROWS_LEVELS["t5_codegen"] == ("medium",)
  assert not plan.has_onpolicy("t5_codegen", "medium")
  assert plan.has_onpolicy("t5_codegen", "small")
  assert all(plan.has_onpolicy(t, lv) for t in ("gemma_completion",
                                                "t5_docstring")
             for lv in ("small", "medium"))
  assert plan.more_inputs("t5_codegen") == plan.MORE_INPUTS["t5_codegen"]
  assert plan.more_inputs("t5_codegen", smoke=True) == plan.SMOKE_EXAMPLES
  assert plan.more_inputs("gemma_completion") == 0
  fam, model, params = _tiny_family(script, n=8)
  exs = dict(fam.examples, validation=stand_in_examples(4, seed=5),
             extra=stand_in_examples(3, seed=7),
             more=stand_in_examples(2, seed=9))
  fam = dataclasses.replace(
      fam, task="t5_codegen", examples=exs,
      train_rows=dme.tokenize(fam.tok, fam.spec, exs["train"]),
      val_rows=dme.tokenize(fam.tok, fam.spec, exs["validation"]))
  args = types.SimpleNamespace(workdir=str(tmp_path / "wd"),
                               out=str(tmp_path / "out"), force=False,
                               smoke=True, smoke_steps=2)
  script.save_model(os.path.join(args.out, "t5_codegen",
                                 dm.LEVEL_DIRS["large"]), model, params)
  for stage in ("large", "large_distill"):
    script.mark_done(os.path.join(args.workdir, "t5_codegen", stage), {})
  progress = script.Progress(args.workdir)
  report = script.stage_teacher(fam, args, progress)
  assert report["more_inputs"] == 2 and report["more_greedy"]["rows"] == 2
  tdir = os.path.join(args.workdir, "t5_codegen", "teacher")
  more = distill_lib.load_rows(os.path.join(tdir, "more.npz"))
  with open(script._pass_path(tdir, "more", "greedy")) as f:
    preds = json.load(f)["preds"]
  assert [r.targets for r in more] == [
      tuple(dm.encode_targets(fam.tok, fam.spec, p)) for p in preds]
  assert [r.inputs for r in more] == [
      tuple(x) for x, _ in dme.tokenize(fam.tok, fam.spec, exs["more"])]
  assert not any(r.data for r in more)
  # A rerun (its done.json gone) reuses every split's saved rows.
  os.remove(os.path.join(tdir, "done.json"))
  monkeypatch.setattr(distill_lib, "teacher_rows", lambda *a, **k: 1 / 0)
  again = script.stage_teacher(fam, args, progress)
  assert {again[f"{s}_topk_seconds"] for s in (
      "validation", "train", "extra", "more")} == {"reused"}
  monkeypatch.undo()
  n_train = 8 * 3  # ground truth + greedy + sampled
  for level, n in (("medium", n_train + 3 + 2), ("small", n_train + 3)):
    assert len(script._distill_data(fam, args, level=level)[0]) == n, level
  # The medium: one round on those rows, no on-policy round.
  monkeypatch.setattr(script.plan, "arch",
                      lambda task, level, tok=None: model.config)
  for level in ("medium", "small"):
    pre = os.path.join(args.workdir, "t5_codegen", f"{level}_pretrain")
    os.makedirs(pre)
    script._save_npz_params(os.path.join(pre, "final_params.npz"), params)
    script.mark_done(pre, {})
  got = script.stage_distill(fam, "medium", args, progress)
  assert got["rows"] == n_train + 5 and "first_round" not in got
  mdir = os.path.join(args.workdir, "t5_codegen", "medium")
  assert not os.path.exists(os.path.join(mdir, "onpolicy.npz"))
  assert os.path.isdir(os.path.join(args.out, "t5_codegen", "medium"))
  # Without its rows the medium's stage says what to do.
  os.remove(os.path.join(tdir, "more.npz"))
  with pytest.raises(SystemExit, match="predates its 'more' split"):
    script._distill_data(fam, args, level="medium")


def test_an_old_bundle_gets_the_more_split_from_this_machines_corpus(
    tmp_path, monkeypatch):
  """A bundle exported before the plan had a 'more' split is refused by
  --data with what to do; --data OLD --export_data NEW copies its data as
  they are and adds 'more' inputs from the corpus, none of them used."""
  import argparse
  from tools.default_models import pretraining
  corpus, pre = _tiny_pretraining(tmp_path)
  script = _script()
  task = "t5_codegen"
  out, wd, old = (str(tmp_path / d) for d in ("out", "work", "old"))
  fam = _corpus_family(script, corpus, pre, out, task, "t5")
  exs = fam.examples
  monkeypatch.setattr(script.plan, "EXTRA_INPUTS", 2)
  exs["extra"] = script.extra_examples(fam, corpus, smoke=False)
  args = argparse.Namespace(workdir=wd, out=out, export_data=old, data="",
                            smoke=False, pretrain_bytes=2**20, force=False,
                            site_packages="")
  script.export_bundle(args, {task: fam}, corpus)  # no 'more' split
  monkeypatch.setitem(script.plan.MORE_INPUTS, task, 2)
  new = str(tmp_path / "new")
  args2 = argparse.Namespace(**{**vars(args), "data": old,
                                "export_data": new})
  with pytest.raises(SystemExit, match="has no 'more' examples of "
                     "t5_codegen.*--export_data NEW_DIR"):
    script.families_from_bundle(args2, [task])
  monkeypatch.setattr(script.corpus_lib, "default_corpus", lambda: corpus)
  monkeypatch.setattr(script.pretrain_lib, "build", lambda *a: pre)
  script.extend_bundle(args2, [task])
  got = script.families_from_bundle(
      argparse.Namespace(**{**vars(args2), "data": new}), [task])[task]
  more = got.examples.pop("more")
  assert got.examples == fam.examples  # the old data, as they were
  assert len(more) == 2
  used = (pretraining.held_out_inputs(corpus)
          | {e["inputs"] for e in exs["train"] + exs["extra"]})
  assert not any(e["inputs"] in used for e in more)
  # From one corpus, the 'more' inputs are the ones after the extra inputs.
  monkeypatch.setattr(script.plan, "EXTRA_INPUTS", 4)
  assert script.extra_examples(fam, corpus, smoke=False) == \
      exs["extra"] + more
  old_pre = script.families_from_bundle(
      argparse.Namespace(**{**vars(args2), "data": old}), [task],
      check_more=False)[task].bundle
  assert got.bundle == old_pre
  info = script.bundle_lib.read_info(new)
  assert info["tasks"][task]["added"]["more"]["examples"] == 2
  assert info["tasks"][task]["examples"]["more"] == 2
  assert info["corpus_hash"] == corpus.corpus_hash


def test_families_from_the_corpus_get_extra_and_more_inputs_in_one_order(
    tmp_path, monkeypatch):
  """families_from_corpus parses the pretraining files' examples once and
  cuts 'extra' and then 'more' from one fixed order, as extra_examples does
  split by split."""
  import argparse
  from tests.eval.test_harness import train_tokenizer
  corpus, pre = _tiny_pretraining(tmp_path)
  script = _script()
  monkeypatch.setattr(script.plan, "EXTRA_INPUTS", 2)
  monkeypatch.setitem(script.plan.MORE_INPUTS, "t5_codegen", 2)
  monkeypatch.setattr(script, "build_tokenizer",
                      lambda *a: train_tokenizer("t5"))
  monkeypatch.setattr(script.pretrain_lib, "build", lambda *a: pre)
  calls = []
  real = script.pretrain_lib.task_examples
  monkeypatch.setattr(script.pretrain_lib, "task_examples",
                      lambda *a: calls.append(1) or real(*a))
  args = argparse.Namespace(out=str(tmp_path / "out"), force=False,
                            smoke=False, site_packages="", pretrain_bytes=0)
  fam = script.families_from_corpus(args, ["t5_codegen"], corpus)[
      "t5_codegen"]
  assert len(calls) == 1
  exs = fam.examples
  assert len(exs["extra"]) == 2 and len(exs["more"]) == 2
  assert exs["extra"] == script.extra_examples(fam, corpus, False)
  assert exs["more"] == script.extra_examples(fam, corpus, False, "more")
  monkeypatch.setattr(script.plan, "EXTRA_INPUTS", 4)
  assert script.extra_examples(fam, corpus, False) == exs["extra"] + \
      exs["more"]
  with pytest.raises(ValueError, match="split must be 'extra' or 'more'"):
    script.extra_examples(fam, corpus, False, "test")
