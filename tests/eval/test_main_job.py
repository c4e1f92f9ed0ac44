"""Main job: end to end on stand-in pairs, resuming, and on the real pairs."""

import dataclasses
import json
import os

import pytest

from specdec_jax.eval import harness, main_job
from tests.eval import test_harness as th

SMALL_GRID = {
    "target_only": {},
    "drafter_only": {},
    "spec_decode": {},
    "token_v3": {"alpha": [0.3, 0.9]},
}


@pytest.fixture(scope="module")
def stand_ins():
  # Two pair names over the same tiny T5 models: the second pair reuses the
  # first one's compiled programs (the decoder-only path is covered by
  # test_harness.py and test_main_job_takes_the_first_examples below).
  t5 = th.stand_in_pair("t5", name="tiny_a")
  return {"tiny_a": t5, "tiny_b": dataclasses.replace(t5, name="tiny_b"),
          "tiny_gemma": th.stand_in_pair("gemma")}


def test_main_job_on_stand_in_pairs_and_resume(stand_ins, tmp_path):
  printed = []
  kw = dict(pairs=("tiny_a", "tiny_b"), num_examples=3,
            grid=SMALL_GRID, gamma=3, progress=False,
            load_pair=lambda name, dtype: stand_ins[name],
            load_examples=lambda name, split: th.stand_in_examples(6),
            print_fn=printed.append)
  out = main_job.run_main_job(str(tmp_path), **kw)
  rows = harness.load_rows(str(tmp_path / "results.jsonl"))
  # 2 pairs x 5 configs x 3 examples, one row each.
  assert len(rows) == len({r["key"] for r in rows}) == 30
  assert [o.run.written for o in out["outcomes"]] == [15, 15]
  # One program per method (encoder inputs share one padded width).
  assert [o.run.warmups for o in out["outcomes"]] == [4, 4]
  for name in ("tiny_a", "tiny_b"):
    png = tmp_path / f"quality_vs_latency_{name}.png"
    assert png.stat().st_size > 1000
  with open(tmp_path / "summary.json") as f:
    summary = json.load(f)
  got = {(s["pair"], s["method"]) for s in summary["summary"]}
  assert got == {(p, m) for p in ("tiny_a", "tiny_b")
                 for m in SMALL_GRID}
  for s in summary["summary"]:
    if s["method"] == "target_only":
      assert s["speedup_matched"] == 1.0
      assert s["best_quality"] == s["target_quality"]
  score = {(a.pair, a.method): a.score for a in out["aggregates"]}
  for p in ("tiny_a", "tiny_b"):  # greedy SpecDecode == target-only
    assert score[(p, "spec_decode")] == score[(p, "target_only")]
  (timing,) = summary["timings"]  # one invocation so far
  assert [t["name"] for t in timing["pairs"]] == ["tiny_a", "tiny_b"]
  assert [t["written"] for t in timing["pairs"]] == [15, 15]
  md = (tmp_path / "summary.md").read_text()
  assert "| token_v3 | 3 | alpha=0.3 |" in md
  text = "\n".join(printed)
  assert "rel. latency" in text and "speedup @ matched quality" in text
  # Greedy SpecDecode is token-identical to target-only on every example.
  pred = {(r["pair"], r["config"]["method"], r["example_id"]): r["tokens"]
          for r in rows}
  for (pair, method, ex), toks in pred.items():
    if method == "spec_decode":
      assert toks == pred[(pair, "target_only", ex)]
  # A rerun resumes: nothing is measured again, the summary is rebuilt.
  again = main_job.run_main_job(str(tmp_path), **kw)
  assert [o.run.written for o in again["outcomes"]] == [0, 0]
  assert [o.run.skipped for o in again["outcomes"]] == [15, 15]
  assert len(harness.load_rows(str(tmp_path / "results.jsonl"))) == 30
  with open(tmp_path / "summary.json") as f:
    runs = json.load(f)["timings"]
  assert [[t["written"] for t in r["pairs"]] for r in runs] == [[15, 15],
                                                               [0, 0]]
  assert [a.score for a in again["aggregates"]] == [
      a.score for a in out["aggregates"]]


def test_main_job_takes_the_first_examples_whatever_their_width(stand_ins,
                                                                 tmp_path):
  """No selection by prompt length: long prompts share the one program."""
  pair = stand_ins["tiny_gemma"]
  short = [dict(id=f"s{i}", inputs="the cat", targets="the cat")
           for i in range(3)]
  long_ = [dict(id=f"l{i}", inputs=" ".join(["the cat sat on a mat"] * 6),
                targets="the cat") for i in range(2)]
  pool = [long_[0], short[0], short[1], long_[1], short[2]]
  widths = [harness.padded_width([p]) for p in pair.encode(pool)["prompts"]]
  assert widths[0] > 16 and widths[1] == 16
  out = main_job.run_main_job(
      str(tmp_path), pairs=("tiny_gemma",), num_examples=4,
      grid={"target_only": {}, "spec_decode": {}}, gamma=2, progress=False,
      load_pair=lambda name, dtype: pair,
      load_examples=lambda name, split: pool, print_fn=lambda s: None)
  rows = harness.load_rows(str(tmp_path / "results.jsonl"))
  assert sorted({r["example_id"] for r in rows}) == ["l0", "l1", "s0", "s1"]
  (outcome,) = out["outcomes"]
  assert outcome.num_examples == 4 and outcome.run.written == 8
  assert outcome.run.pad_width == widths[0]
  assert outcome.run.warmups == 2  # one program per method
  with open(tmp_path / "summary.json") as f:
    (timing,) = json.load(f)["timings"]
  assert timing["pairs"][0]["pad_width"] == widths[0]
  by = {(r["config"]["method"], r["example_id"]): r["tokens"] for r in rows}
  for ex in ("l0", "s0", "s1", "l1"):  # greedy SpecDecode is lossless
    assert by[("spec_decode", ex)] == by[("target_only", ex)]


def test_default_grid_covers_the_papers_methods():
  want = {"target_only", "drafter_only", "spec_decode", "lossy",
          "lossy_tuned", "bild", "bild_star", "chow", "diff", "opt",
          "token_v1", "token_v2", "token_v3", "token_cascade", "seq_cascade"}
  assert set(main_job.DEFAULT_GRID) == want
  cfgs = harness.grid(main_job.DEFAULT_GRID)  # every knob value is valid
  for m, knobs in main_job.DEFAULT_GRID.items():
    n = 1
    for values in knobs.values():
      n *= len(values)
    assert sum(c.method == m for c in cfgs) == n


def test_command_line_maps_flags(monkeypatch, tmp_path):
  got = {}
  monkeypatch.setattr(main_job, "run_main_job",
                      lambda out_dir, **kw: got.update(kw, out_dir=out_dir))
  monkeypatch.setattr(main_job, "enable_compilation_cache",
                      lambda path: got.update(cache=path))
  main_job.main(["--out_dir", str(tmp_path), "--pairs", "t5_docstring",
                 "--methods", "target_only,token_v3", "--temperature",
                 "0,0.5", "--top_p", "1,0.9", "--gamma", "3,5",
                 "--num_examples", "4", "--repeats", "2"])
  assert got["grid"] == {"target_only": {},
                         "token_v3": main_job.DEFAULT_GRID["token_v3"]}
  assert got["pairs"] == ["t5_docstring"]
  assert (got["temperature"], got["top_p"], got["gamma"]) == (
      [0.0, 0.5], [1.0, 0.9], [3, 5])
  assert (got["num_examples"], got["repeats"]) == (4, 2)
  assert "prompt_widths" not in got
  assert got["cache"] == str(tmp_path / "jax_cache")
  with pytest.raises(SystemExit, match="not in the grid"):
    main_job.main(["--out_dir", str(tmp_path), "--methods", "nope"])


# Another default-models directory (e.g. a `train_default_models.py --smoke`
# build) for the end-to-end test; default: the package's assets.
ASSETS = os.environ.get("SPECDEC_TEST_DEFAULT_MODELS")


def _real_pairs_or_skip():
  try:
    from specdec_jax.eval import default_models  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    pytest.skip(f"specdec_jax.eval.default_models is not available: {e}")
  try:
    for name in default_models.PAIRS:
      default_models.load(name, **({"assets": ASSETS} if ASSETS else {}))
  except ValueError as e:
    if "not built" not in str(e):
      raise
    pytest.skip(f"the default models are not built: {e}")
  return default_models


@pytest.mark.slow
def test_main_job_on_the_real_default_pairs(tmp_path):
  dm = _real_pairs_or_skip()
  out = main_job.run_main_job(
      str(tmp_path), num_examples=2, progress=False, assets=ASSETS,
      grid={"target_only": {}, "spec_decode": {},
            "token_v3": {"alpha": [0.5]}})
  rows = harness.load_rows(str(tmp_path / "results.jsonl"))
  assert len(rows) == len(dm.PAIRS) * 3 * 2
  by = {(r["pair"], r["config"]["method"], r["example_id"]): r for r in rows}
  for (pair, method, ex), r in by.items():
    assert r["num_tokens"] > 0 and r["latency_s"] > 0
    if method == "spec_decode":  # greedy: lossless, token for token
      assert r["tokens"] == by[(pair, "target_only", ex)]["tokens"]
  for pair in dm.PAIRS:
    assert os.path.getsize(tmp_path / f"quality_vs_latency_{pair}.png") > 1000
  assert {s.pair for s in out["summary"]} == set(dm.PAIRS)
