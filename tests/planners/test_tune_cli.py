"""`specdec_jax tune` end to end on the tiny random pair, then a decode with
run.strategy = 'auto' that reads the file it wrote; the CLI's errors."""

import gin
import pytest

from specdec_jax import decoding, main
from specdec_jax.decoding.planners import auto


@pytest.fixture(autouse=True)
def clean_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def _table(batches, gamma=2):
  cand = auto.Candidate("spec_decode", decoding.Chain(gamma), (0, 1))
  base = auto.Measured(auto.Candidate("target_only", decoding.Chain(1), (1,)),
                       10.0, 1.0)
  rows = tuple(auto.Row(b, auto.Measured(cand, 20.0, 2.0), 10.0,
                        (base, auto.Measured(cand, 20.0, 2.0)))
               for b in batches)
  return auto.AutoTable(rows)


@pytest.mark.slow
def test_tune_writes_a_file_that_decode_auto_runs(tmp_path, capsys):
  out = tmp_path / "auto.gin"
  main.parse_gin(["runs/tune.gin", "pairs/tiny_random.gin"],
                 ["GAMMAS = [2]", "TREES = []", "BATCH_SIZES = [1]",
                  "NUM_PROMPTS = 2", "NEW_TOKENS = 4", "REPEATS = 1",
                  "PRICE = False", f"OUTPUT = '{out}'"])
  table = main.run()
  printed = capsys.readouterr().out
  assert "| batch | candidate | tokens/s | x target-only" in printed
  assert f"wrote {out}" in printed
  assert auto.load(str(out)) == table and table.batches == (1,)
  assert {m.candidate.label for m in table.rows[0].candidates} == {
      "target_only", "chain:2"}
  gin.clear_config()
  req = tmp_path / "req.jsonl"
  req.write_text('{"tokens": [2, 5, 9]}\n')
  main.parse_gin(["runs/decode.gin", "pairs/tiny_random.gin"],
                 [f"INPUT_FILE = '{req}'", f"OUTPUT_DIR = '{tmp_path}'",
                  "MAX_NEW_TOKENS = 5", "BATCH_SIZE = 1",
                  "run.strategy = 'auto'", f"run.tune_file = '{out}'"])
  rows = main.run()
  assert rows[0]["num_tokens"] == 5
  chose = table.rows[0].choice.candidate
  assert (rows[0]["drafted"] > 0) == (chose.method == "spec_decode")


def test_decode_auto_runs_the_row_of_batch_size(tmp_path):
  path = tmp_path / "auto.gin"
  _table((2,), gamma=3).save(str(path))
  req = tmp_path / "req.jsonl"
  req.write_text('{"tokens": [2, 5, 9]}\n')
  base = ["runs/decode.gin", "pairs/tiny_random.gin"]
  bindings = [f"INPUT_FILE = '{req}'", "run.strategy = 'auto'",
              f"run.tune_file = '{path}'"]
  main.parse_gin(base, bindings + ["BATCH_SIZE = 1"])
  with pytest.raises(ValueError, match="batch size 1 is not covered"):
    main.run()
  gin.clear_config()
  main.parse_gin(base, bindings[:2] + [
      f"run.tune_file = '{tmp_path / 'none.gin'}'"])
  with pytest.raises(ValueError, match="cannot read the tune file"):
    main.run()
  from specdec_jax import tune_run  # pylint: disable=g-import-not-at-top
  method, gamma, tree = tune_run.structure_of(_table((1, 8), 3), 9)
  assert method == decoding.make_method("spec_decode") and gamma == 3
  assert tree is None


@pytest.mark.parametrize("bindings,match", [
    (["OBJECTIVE = 'speed'"], "unknown objective 'speed'"),
    (["OBJECTIVE = 'quality'"], "needs exactly one of latency_budget"),
    (["GAMMAS = []", "TREES = []"], "the candidate list is empty"),
    (["BATCH_SIZES = []"], "batch_sizes is empty"),
    (["BATCH_SIZES = [0]"], "batch_sizes must be integers >= 1"),
    (["TREES = [[2]]"], "trees are \\(k, depth\\) pairs"),
    (["OUTPUT = '/etc/hostname/auto.gin'"], "cannot write OUTPUT"),
])
def test_tune_cli_errors(bindings, match):
  main.parse_gin(["runs/tune.gin", "pairs/tiny_random.gin"], bindings)
  with pytest.raises(ValueError, match=match):
    main.run()


def test_a_second_tune_reads_the_table_back_from_the_store(
    tmp_path, capsys, monkeypatch):
  from specdec_jax import program_cache  # pylint: disable=g-import-not-at-top
  from specdec_jax.decoding import planners  # pylint: disable=g-import-not-at-top
  calls = []
  monkeypatch.setattr(planners, "tune", lambda *a, **k: calls.append(k) or
                      _table((1,)))

  def tune(*extra):
    gin.clear_config()
    main.parse_gin(["runs/tune.gin", "pairs/tiny_random.gin"],
                   ["GAMMAS = [2]", "TREES = []", "BATCH_SIZES = [1]",
                    "NUM_PROMPTS = 2", "NEW_TOKENS = 4", *extra])
    return main.run(), capsys.readouterr().out

  program_cache.enable(str(tmp_path / "store"))
  try:
    first, _ = tune()
    again, out = tune()
    assert len(calls) == 1 and again == first
    assert "reused the tuned table from the user cache (tuned in" in out
    tune("REUSE = False")  # --retune
    tune("NEW_TOKENS = 5")  # another key
    assert len(calls) == 3
  finally:
    program_cache.enable(None)
  tune()  # store off
  assert len(calls) == 4


def test_strategy_auto_is_for_decode():
  with pytest.raises(ValueError, match="run.strategy = 'auto' is read by "
                     "mode decode"):
    main.run(mode="plan", strategy="auto")
  with pytest.raises(ValueError, match="run.tune_file is read by "
                     "run.strategy = 'auto' only"):
    main.run(mode="plan", tune_file="x.gin")


def test_t5x_model_takes_the_auto_row(tmp_path):
  from specdec_jax.t5x import models as t5x_models  # pylint: disable=g-import-not-at-top

  class Vocab:
    vocab_size, eos_id = 64, 1

  path = tmp_path / "auto.gin"
  _table((1, 8), gamma=3).save(str(path))
  m = t5x_models.SpeculativeEncoderDecoderModel(
      "t5_tiny", "t5_tiny", Vocab(), Vocab(), method="auto",
      tune_file=str(path), batch_size=8)
  assert m.gamma == 3 and m.method == decoding.make_method("spec_decode")
  with pytest.raises(ValueError, match="method='auto' needs tune_file="):
    t5x_models.SpeculativeEncoderDecoderModel("t5_tiny", "t5_tiny", Vocab(),
                                              Vocab(), method="auto")
