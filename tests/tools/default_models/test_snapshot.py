"""Committed build snapshots (tools/default_models/snapshot.py): what is
kept, exact bfloat16 round trips, and a build resumed from a snapshot."""

import json
import os

import jax
import ml_dtypes
import numpy as np
import pytest

from tests.tools.default_models import load_tool
from tests.tools.default_models.test_train import resume_case
from tools.default_models import train



def _load(name):
  return load_tool(name)


snap = _load("snapshot")


def _write(path, text="x"):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    f.write(text)


def _npz(path, **arrays):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  np.savez(path, **arrays)


def _fake_build(tmp_path):
  """A workdir / out mid-build: T5 large done (its pretraining's result no
  longer needed), teacher done, medium in round 2, small pretraining done,
  small not started; Gemma large pretraining in progress."""
  wd, out = tmp_path / "wd", tmp_path / "out"
  t5, gm = wd / "t5_docstring", wd / "gemma_completion"
  _write(str(wd / "progress.jsonl"), "{}\n")
  _npz(str(t5 / "pretrain_tokens.npz"), stream=np.arange(5, dtype=np.int16))
  _write(str(t5 / "large.lock"), "1 boot")
  for stage in ("large_pretrain", "large", "teacher", "medium_pretrain",
                "small_pretrain"):
    _write(str(t5 / stage / "done.json"), json.dumps({"stage": stage}))
  for stage in ("large_pretrain", "medium_pretrain", "small_pretrain"):
    _npz(str(t5 / stage / "final_params.npz"),
         leaf_00000=np.float32([1.0, 2.0]))
  _npz(str(t5 / "large" / "train_state.npz"), leaf_00000=np.float32([3.0]))
  _write(str(t5 / "teacher" / "train_greedy_outputs.json"), '{"preds": []}')
  _npz(str(t5 / "teacher" / "train.npz"), a=np.zeros(3))
  _npz(str(t5 / "medium" / "train_state.npz"),
       leaf_00000=np.float32([1.0 + 2**-12, 5.0]), leaf_00001=np.int32(7),
       best_step=np.int64(4), best_loss=np.float64(2.5))
  _npz(str(t5 / "medium" / "best_params.npz"), leaf_00000=np.float32([1.5]))
  _write(str(t5 / "medium" / "history.json"), json.dumps(
      [dict(step=1, elapsed_s=100.0), dict(step=2, elapsed_s=400.0),
       dict(step=3, elapsed_s=50.0)]))  # resumed once: 450 s in all
  _write(str(t5 / "medium" / "train_student_greedy_outputs.json"), "{}")
  _npz(str(t5 / "medium" / "onpolicy.npz"), a=np.zeros(3))
  _npz(str(t5 / "medium" / "onpolicy" / "train_state.npz"),
       leaf_00000=np.float32([0.25]))
  _npz(str(gm / "large_pretrain" / "train_state.npz"),
       leaf_00000=np.float32([4.0]))
  _npz(str(gm / "large_pretrain" / "best_params.npz"),  # not needed
       leaf_00000=np.float32([4.0]))
  _npz(str(wd / "xla_cache" / "t5_docstring" / "x.npz"), a=np.zeros(2))
  _write(str(out / "t5_docstring" / "tokenizer.model"), "spm")
  _write(str(out / "t5_docstring" / "verifier" / "config.json"), "{}")
  return str(wd), str(out)


def test_plan_keeps_what_a_restart_needs_and_nothing_recomputable(tmp_path):
  wd, out = _fake_build(tmp_path)
  kept = {rel: kind for kind, _, rel in snap.plan_files(wd, out)}
  t5 = "workdir/t5_docstring"
  assert kept == {
      "workdir/progress.jsonl": "copy",
      f"{t5}/large_pretrain/done.json": "copy",
      f"{t5}/large/done.json": "copy",
      # Both students unfinished: the teacher reruns (from its saved
      # passes) to recompute the top-k rows, which are not kept.
      f"{t5}/teacher/train_greedy_outputs.json": "copy",
      f"{t5}/medium_pretrain/done.json": "copy",
      f"{t5}/medium_pretrain/final_params.npz": "pack",
      f"{t5}/small_pretrain/done.json": "copy",
      f"{t5}/small_pretrain/final_params.npz": "pack",
      f"{t5}/medium/train_state.npz": "pack",
      f"{t5}/medium/best_params.npz": "pack",
      f"{t5}/medium/history.json": "copy",
      f"{t5}/medium/train_student_greedy_outputs.json": "copy",
      f"{t5}/medium/onpolicy/train_state.npz": "pack",
      "workdir/gemma_completion/large_pretrain/train_state.npz": "pack",
      "out/t5_docstring/tokenizer.model": "copy",
      "out/t5_docstring/verifier/config.json": "copy",
  }
  # A stage in progress is kept only once it has trained long enough.
  kept = {rel for _, _, rel in snap.plan_files(wd, out, 450.0)}
  assert f"{t5}/medium/train_state.npz" in kept
  assert "workdir/gemma_completion/large_pretrain/train_state.npz" not in kept
  kept = {rel for _, _, rel in snap.plan_files(wd, out, 451.0)}
  assert f"{t5}/medium/train_state.npz" not in kept
  assert f"{t5}/medium/train_student_greedy_outputs.json" in kept
  # Once both students are done the teacher counts as done.
  for level in ("medium", "small"):
    _write(os.path.join(wd, "t5_docstring", level, "done.json"), "{}")
  kept = {rel for _, _, rel in snap.plan_files(wd, out)}
  assert f"{t5}/teacher/done.json" in kept
  assert f"{t5}/medium/train_state.npz" not in kept
  assert f"{t5}/medium_pretrain/final_params.npz" not in kept


def test_save_restore_round_trip(tmp_path):
  wd, out = _fake_build(tmp_path)
  dest = str(tmp_path / "snap")
  manifest = snap.save(wd, out, dest)
  assert set(os.listdir(dest)) == {"workdir", "out", snap.MANIFEST}
  assert manifest["bytes"] > 0
  wd2, out2 = str(tmp_path / "wd2"), str(tmp_path / "out2")
  snap.restore(wd2, out2, dest)
  state = os.path.join(wd2, "t5_docstring", "medium", "train_state.npz")
  with np.load(state) as f:
    # float32 -> bfloat16 (round to nearest even), integers exact.
    np.testing.assert_array_equal(f["leaf_00000"], np.float32([1.0, 5.0]))
    assert f["leaf_00000"].dtype == np.float32
    assert f["leaf_00001"] == 7 and f["leaf_00001"].dtype == np.int32
    assert float(f["best_loss"]) == 2.5 and int(f["best_step"]) == 4
  with open(os.path.join(out2, "t5_docstring", "tokenizer.model")) as f:
    assert f.read() == "spm"
  assert not os.path.exists(os.path.join(wd2, "t5_docstring", "teacher",
                                         "train.npz"))
  # Restoring over existing files is refused; a non-snapshot is named.
  with pytest.raises(FileExistsError, match="restore into an empty"):
    snap.restore(wd2, out2, dest)
  with pytest.raises(FileNotFoundError, match="not a snapshot"):
    snap.restore(wd2, out2, str(tmp_path / "wd"))
  with pytest.raises(ValueError, match="nothing to snapshot"):
    snap.save(str(tmp_path / "none"), str(tmp_path / "none"), dest)


def test_bf16_rounded_values_round_trip_exactly(tmp_path):
  x = np.random.default_rng(0).normal(size=(64,)).astype(np.float32)
  rounded = x.astype(ml_dtypes.bfloat16).astype(np.float32)
  _npz(str(tmp_path / "a.npz"), leaf_00000=rounded)
  snap.pack_npz(str(tmp_path / "a.npz"), str(tmp_path / "p.npz"))
  snap.unpack_npz(str(tmp_path / "p.npz"), str(tmp_path / "b.npz"))
  with np.load(str(tmp_path / "b.npz")) as f:
    np.testing.assert_array_equal(f["leaf_00000"], rounded)
  # The build rounds every stage result the same way.
  script = _load("build")
  got = script.to_bf16({"w": x})["w"]
  np.testing.assert_array_equal(got, rounded)
  assert got.dtype == np.float32


def test_a_stage_resumed_from_a_snapshot_continues_the_run(tmp_path):
  """Train 6 steps; separately train 3, snapshot, restore into a fresh
  workdir and finish: the resumed run starts at step 3 and ends where the
  uninterrupted one does, up to the bfloat16 rounding of the step-3 state."""
  model, params, cfg, stream, evals = resume_case()
  full = train.train(model, params, cfg, stream, evals, log=None)

  def stops_after_3(start):
    it = stream(start)
    for _ in range(3):
      yield next(it)
    raise KeyboardInterrupt("session over")

  wd = tmp_path / "wd" / "gemma_completion" / "large_pretrain"
  with pytest.raises(KeyboardInterrupt):
    train.train(model, params, cfg, stops_after_3, evals, workdir=str(wd),
                log=None)
  snap.save(str(tmp_path / "wd"), str(tmp_path / "out"),
            str(tmp_path / "snap"))
  wd2 = tmp_path / "wd2"
  snap.restore(str(wd2), str(tmp_path / "out2"), str(tmp_path / "snap"))
  wd2 = wd2 / "gemma_completion" / "large_pretrain"
  like = train.init_state(params, cfg)
  before, after = train.restore_state(str(wd), like), train.restore_state(
      str(wd2), like)
  assert int(after[0].step) == 3 and after[1:3] == before[1:3]
  for a, b in zip(jax.tree.leaves(before[0]), jax.tree.leaves(after[0])):
    a = np.asarray(a)
    if a.dtype == np.float32:
      a = a.astype(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(a, np.asarray(b))
  lines = []
  resumed = train.train(model, params, cfg, stream, evals, workdir=str(wd2),
                        log=lines.append)
  assert lines[0] == f"resumed from {wd2} at step 3"
  gap = lambda x, y: max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                         for a, b in zip(jax.tree.leaves(x),
                                         jax.tree.leaves(y)))
  # Far closer to the uninterrupted run than to where training started.
  assert gap(full.params, resumed.params) < 2e-2
  assert gap(full.params, resumed.params) < 0.2 * gap(full.params, params)


def test_a_self_distilling_task_keeps_its_finetuned_large_until_used(
    tmp_path):
  """The fine-tuned large (``large/model``) is kept while self_teacher or
  large_distill, which read it, is unfinished; self_teacher's rows are
  recomputed (its done.json dropped) while large_distill is unfinished."""
  wd, out = _fake_build(tmp_path)
  t5 = os.path.join(wd, "t5_docstring")
  _write(os.path.join(t5, "large", "model", "config.json"), "{}")
  _write(os.path.join(t5, "large", "model", "params.safetensors"), "w")
  _write(os.path.join(t5, "self_teacher", "done.json"), "{}")
  _write(os.path.join(t5, "self_teacher", "train_greedy_outputs.json"), "{}")
  rel = "workdir/t5_docstring"
  kept = {r for _, _, r in snap.plan_files(wd, out)}
  assert {f"{rel}/large/model/config.json",
          f"{rel}/large/model/params.safetensors",
          f"{rel}/self_teacher/train_greedy_outputs.json"} <= kept
  assert f"{rel}/self_teacher/done.json" not in kept  # large_distill's rows
  _write(os.path.join(t5, "large_distill", "done.json"), "{}")
  kept = {r for _, _, r in snap.plan_files(wd, out)}
  assert f"{rel}/large_distill/done.json" in kept
  assert f"{rel}/self_teacher/done.json" in kept
  assert not any("/large/model/" in r for r in kept)
  # A task without large/model has no self stages to wait for.
  assert not snap._pending(os.path.join(wd, "gemma_completion"),
                           "large_distill")
