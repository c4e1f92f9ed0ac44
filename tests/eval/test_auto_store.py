"""The main job's auto tables in the per-user store: a second job with a
fresh output directory reads them back (no tune); any change of what the
tune depends on tunes again."""

import argparse
import dataclasses
import os

import jax
import numpy as np
import pytest

from specdec_jax import program_cache
from specdec_jax.decoding.planners import auto, tune_store
from specdec_jax.eval import auto_rows
from tests.eval import test_harness as th
from tests.planners.test_auto import FakeMeasurer

SETTINGS = auto_rows.AutoSettings(num_examples=2, gammas=(2, 3), trees=(),
                                  alphas=(0.5,), price=False)
JOB = dict(temperature=0.0, top_p=1.0, gamma=3, max_new_tokens=None,
           batch_size=1, seed=0, stack=None, alphas=None)


@pytest.fixture(scope="module")
def pair():
  return th.stand_in_pair("t5", name="tiny_store")


@pytest.fixture
def store(tmp_path):
  """The program store on at a fresh directory (off again afterwards)."""
  path = tmp_path / "store"
  program_cache.enable(str(path))
  try:
    yield path
  finally:
    program_cache.enable(None)


def _tune(pair, out_dir, settings=SETTINGS, examples=(4,), store=True,
          **job):
  """(PairTune, measure calls, printed lines) of one tune_pair call."""
  fake = FakeMeasurer({1: {"chain:2": (1.3, 1.0)}})
  said = []
  tuned = auto_rows.tune_pair(
      pair, lambda name, split: th.stand_in_examples(*examples), str(out_dir),
      settings, **{**JOB, **job}, measurer=fake, store=store,
      say=said.append)
  return tuned, len(fake.asked), said


def test_a_fresh_job_reads_the_tables_back_from_the_store(pair, store,
                                                          tmp_path):
  first, calls, _ = _tune(pair, tmp_path / "a")
  assert calls > 0 and first.reused == () and first.from_store == ()
  assert len(os.listdir(store)) == 2  # one entry per objective
  again, calls, said = _tune(pair, tmp_path / "b")
  assert calls == 0  # no tune
  assert again.tables == first.tables and again.configs == first.configs
  assert set(again.reused) == set(again.from_store) == set(auto_rows.LABELS)
  assert again.tune_s == pytest.approx(first.tune_s, abs=1e-6)
  assert ("[tiny_store] auto: reused the tuned table from the user cache "
          "(tuned in") in " ".join(said)
  for objective in auto_rows.LABELS:  # the job's files are complete
    path = auto_rows.table_path(str(tmp_path / "b"), "tiny_store", objective)
    assert auto.load(path) == first.tables[objective]
    assert "read back from the user cache (tuned in" in open(path).read()
  # ... and a resumed job reads its own files (no store, no tune).
  resumed, calls, _ = _tune(pair, tmp_path / "b", store=False)
  assert calls == 0 and resumed.from_store == ()
  assert resumed.tables == first.tables


def test_any_change_of_the_key_tunes_again(pair, store, tmp_path):
  _tune(pair, tmp_path / "a")
  params = jax.tree_util.tree_map(lambda x: x + 1, pair.p_params)
  changed = [
      dict(temperature=0.5), dict(top_p=0.9), dict(gamma=4),
      dict(max_new_tokens=8), dict(seed=1), dict(alphas=(0.3,)),
      dict(settings=dataclasses.replace(SETTINGS, repeats=2)),
      dict(settings=dataclasses.replace(SETTINGS, gammas=(2, 4))),
      dict(examples=(4, 1)),  # other calibration examples
      dict(pair=dataclasses.replace(pair, p_params=params))]
  for i, change in enumerate(changed):
    kw = dict(change)
    tuned, calls, _ = _tune(kw.pop("pair", pair), tmp_path / f"c{i}", **kw)
    assert calls > 0 and tuned.from_store == (), change
  # The unchanged job still hits.
  _, calls, _ = _tune(pair, tmp_path / "same")
  assert calls == 0


def test_store_off_or_an_injected_measurer_always_tunes(pair, tmp_path):
  program_cache.enable(None)
  for out in ("a", "b"):
    assert _tune(pair, tmp_path / out)[1] > 0
  program_cache.enable(str(tmp_path / "store"))
  try:  # on, but a test's measurer is cached only when it opts in
    for out in ("c", "d"):
      assert _tune(pair, tmp_path / out, store=None)[1] > 0
    assert not os.path.exists(tmp_path / "store")
  finally:
    program_cache.enable(None)


def test_a_corrupt_entry_tunes_again(pair, store, tmp_path):
  first, _, _ = _tune(pair, tmp_path / "a")
  names = sorted(os.listdir(store))
  (store / names[0]).write_text("{not json")
  (store / names[1]).write_text('{"key": "k", "value": {"gin": "x = 1", '
                                '"tune_s": 1.0}}')
  again, calls, _ = _tune(pair, tmp_path / "b")
  assert calls > 0 and again.from_store == ()
  assert again.configs == first.configs
  # Tuned again and stored again: the next job hits.
  assert _tune(pair, tmp_path / "c")[1] == 0


def test_reuse_false_tunes_again_and_replaces_the_tables(pair, store,
                                                         tmp_path):
  _tune(pair, tmp_path / "a")
  retune = dataclasses.replace(SETTINGS, reuse=False)
  for out in ("a", "b"):  # neither the job's files nor the store are read
    tuned, calls, _ = _tune(pair, tmp_path / out, settings=retune)
    assert calls > 0 and tuned.reused == ()
  assert _tune(pair, tmp_path / "c")[1] == 0


def test_params_fingerprint_sees_values_shapes_and_names():
  base = {"a": np.zeros((2, 3), np.float32), "b": np.ones(4, np.int32)}
  fp = tune_store.params_fingerprint
  assert fp(base) == fp({k: v.copy() for k, v in base.items()})
  other = dict(base, a=base["a"].copy())
  other["a"][1, 2] = 1e-7
  assert len({fp(base), fp(other), fp(dict(base, a=np.zeros((3, 2)))),
              fp({"c": base["a"], "b": base["b"]})}) == 4


def test_retune_flag_of_the_main_job_module():
  ap = argparse.ArgumentParser()
  auto_rows.add_flags(ap)
  assert auto_rows.settings_of(ap.parse_args([])).reuse is True
  assert auto_rows.settings_of(ap.parse_args(["--retune"])).reuse is False
