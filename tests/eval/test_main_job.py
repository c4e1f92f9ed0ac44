"""Main job: end to end on stand-in pairs, resuming, and on the real pairs."""

import dataclasses
import json
import os

import pytest

from specdec_jax.eval import harness, main_job, plots
from tests.eval import test_harness as th

SMALL_GRID = {
    "target_only": {},
    "drafter_only": {},
    "spec_decode": {},
    "token_v3": {"alpha": [0.3, 0.9]},
    "hsd": {},  # main_job.HSD_BUFFERS over small > medium > large
    "tree": {},  # SpecDecode on main_job.TREE_SPEC
}
HSD_LABEL = "HSD small>medium>large (3,6)"
TREE_LABEL = "SpecDecode tree 2x3"


@pytest.fixture(scope="module")
def stand_ins():
  # Two pair names over the same tiny T5 models: the second pair reuses the
  # first one's compiled programs (the decoder-only path is covered by
  # test_harness.py and test_main_job_takes_its_examples_whatever_their_width below).
  # tiny_a has a medium level (runs the hierarchy), tiny_b does not.
  t5 = th.stand_in_pair("t5", name="tiny_a")
  return {"tiny_a": th.three_levels(t5),
          "tiny_b": dataclasses.replace(t5, name="tiny_b"),
          "tiny_gemma": th.stand_in_pair("gemma")}


def test_main_job_on_stand_in_pairs_and_resume(stand_ins, tmp_path):
  printed = []
  kw = dict(pairs=("tiny_a", "tiny_b"), num_examples=3,
            grid=SMALL_GRID, gamma=3, progress=False,
            load_pair=lambda name, dtype: stand_ins[name],
            load_examples=lambda name, split: th.stand_in_examples(6),
            print_fn=printed.append,
            auto=False)  # the auto rows: tests/eval/test_auto_rows.py
  out = main_job.run_main_job(str(tmp_path), **kw)
  rows = harness.load_rows(str(tmp_path / "results.jsonl"))
  # tiny_a: 7 configs (5 on the chain, HSD, tree); tiny_b has no medium
  # model: 6 (no HSD). 3 examples each, one row each.
  assert len(rows) == len({r["key"] for r in rows}) == 39
  assert [o.run.written for o in out["outcomes"]] == [21, 18]
  # One program per method and draft structure (encoder inputs share one
  # padded width).
  assert [o.run.warmups for o in out["outcomes"]] == [6, 5]
  _check_draft_rows(out, printed, tmp_path)
  for name in ("tiny_a", "tiny_b"):
    png = tmp_path / f"quality_vs_latency_{name}.png"
    assert png.stat().st_size > 1000
  with open(tmp_path / "summary.json") as f:
    summary = json.load(f)
  got = {(s["pair"], s["method"], s["draft"], s["label"])
         for s in summary["summary"]}
  chain = {(p, m, "", plots.LABELS[m]) for p in ("tiny_a", "tiny_b")
           for m in ("target_only", "drafter_only", "spec_decode",
                     "token_v3")}
  assert got - chain == {
      ("tiny_a", "spec_decode", "hierarchy=3,6", HSD_LABEL),
      ("tiny_a", "spec_decode", "tree=kary:2,3", TREE_LABEL),
      ("tiny_b", "spec_decode", "tree=kary:2,3", TREE_LABEL)}
  assert chain <= got
  for s in summary["summary"]:
    if s["method"] == "target_only":
      assert s["speedup_matched"] == 1.0
      assert s["best_quality"] == s["target_quality"]
    if s["method"] == "spec_decode":  # lossless: quality matched at once
      assert s["best_quality"] in (s["target_quality"], None)
      assert s["speedup_matched"] == s["speedup_matched_point"]
  (timing,) = summary["timings"]  # one invocation so far
  assert [t["name"] for t in timing["pairs"]] == ["tiny_a", "tiny_b"]
  assert [t["written"] for t in timing["pairs"]] == [21, 18]
  md = (tmp_path / "summary.md").read_text()
  assert "| token_v3 | 3 | alpha=0.3 |" in md
  text = "\n".join(printed)
  assert "rel. latency" in text and "speedup @ matched quality" in text
  # Greedy SpecDecode -- on the chain, the hierarchy and the tree -- is
  # token-identical to target-only on every example.
  pred = {(r["pair"], r["config_key"], r["example_id"]): r["tokens"]
          for r in rows}
  base = harness.RunConfig("target_only").key
  lossless = [k for k in pred if k[1].startswith("spec_decode[")]
  assert len(lossless) == 3 * 3 + 2 * 3
  for pair, key, ex in lossless:
    assert pred[(pair, key, ex)] == pred[(pair, base, ex)]
  # A rerun resumes: nothing is measured again, the summary is rebuilt.
  again = main_job.run_main_job(str(tmp_path), **kw)
  assert [o.run.written for o in again["outcomes"]] == [0, 0]
  assert [o.run.skipped for o in again["outcomes"]] == [21, 18]
  assert len(harness.load_rows(str(tmp_path / "results.jsonl"))) == 39
  with open(tmp_path / "summary.json") as f:
    runs = json.load(f)["timings"]
  assert [[t["written"] for t in r["pairs"]] for r in runs] == [[21, 18],
                                                               [0, 0]]
  assert [a.score for a in again["aggregates"]] == [
      a.score for a in out["aggregates"]]


def _check_draft_rows(out, printed, tmp_path):
  """The HSD and tree rows of the stand-in job: skipped where there is no
  medium model, target-only's quality, readable labels in tables and plots."""
  skip = (f"skipping {HSD_LABEL}: hierarchy=(3, 6) needs 3 levels (small>"
          f"medium>large) but pair 'tiny_b' has 2 (no medium model: build "
          f"the assets with one, see docs/default_models.md); give 1 buffer "
          f"size(s) or use a pair with 3 levels")
  assert [o.skipped for o in out["outcomes"]] == [[], [skip]]
  assert f"[tiny_b] {skip}" in printed
  score = {(a.pair, a.config.label): a.score for a in out["aggregates"]}
  for p, label in [("tiny_a", "SpecDecode"), ("tiny_a", HSD_LABEL),
                   ("tiny_a", TREE_LABEL), ("tiny_b", "SpecDecode"),
                   ("tiny_b", TREE_LABEL)]:  # greedy: == target-only
    assert score[(p, label)] == score[(p, "Target only (large)")]
  md = (tmp_path / "summary.md").read_text()
  assert f"| {HSD_LABEL} | - | 1 |" in md  # the summary table
  assert f"| {TREE_LABEL} | - | - |" in md  # the results table
  drawn = plots.plot_quality_vs_latency(  # the legend names the new curves
      [a for a in out["aggregates"] if a.pair == "tiny_a"],
      str(tmp_path / "a.png"))
  assert {HSD_LABEL, TREE_LABEL, "SpecDecode"} <= set(drawn)
  assert drawn[HSD_LABEL][1] == [score[("tiny_a", "Target only (large)")]]


def test_main_job_takes_its_examples_whatever_their_width(stand_ins,
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
      load_examples=lambda name, split: pool, print_fn=lambda s: None,
      auto=False)
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
  assert set(main_job.DEFAULT_GRID) == want | {"hsd", "tree"}
  # every knob value is valid
  cfgs = main_job.make_configs(main_job.DEFAULT_GRID, gamma=[3, 5])
  chain = [c for c in cfgs if not c.draft]
  assert chain == harness.grid({m: k for m, k in main_job.DEFAULT_GRID.items()
                                if m in want}, gamma=[3, 5])
  for m, knobs in main_job.DEFAULT_GRID.items():
    n = 1
    for values in knobs.values():
      n *= len(values)
    if m in want:
      gammas = 1 if m in harness.NO_GAMMA else 2
      assert sum(c.method == m for c in chain) == n * gammas
  # The draft rows: once each, whatever the gamma sweep.
  assert main_job.HSD_BUFFERS == (3, 6) and main_job.TREE_SPEC == "kary:2,3"
  tail = "|max_new=None|bs=1|seed=0"
  assert [c.key for c in cfgs if c.draft] == [
      f"spec_decode[]|T=0.0|top_p=1.0|gamma=0{tail}|hierarchy=3,6",
      f"spec_decode[]|T=0.0|top_p=1.0|gamma=0{tail}|tree=kary:2,3"]
  assert [c.label for c in cfgs if c.draft] == [HSD_LABEL, TREE_LABEL]
  with pytest.raises(ValueError, match=r"^unknown grid row 'nope': use a "
                     r"method name \(bild, .*\) or a draft row \(hsd, "
                     r"tree\)$"):
    main_job.make_configs({"nope": {}})


def test_command_line_maps_flags(monkeypatch, tmp_path):
  got = {}
  monkeypatch.setattr(main_job, "run_main_job",
                      lambda out_dir, **kw: got.update(kw, out_dir=out_dir))
  monkeypatch.setattr(main_job, "enable_compilation_cache",
                      lambda path: got.update(cache=path))
  main_job.main(["--out_dir", str(tmp_path), "--pairs", "t5_codegen",
                 "--methods", "target_only,token_v3,hsd", "--temperature",
                 "0,0.5", "--top_p", "1,0.9", "--gamma", "3,5",
                 "--num_examples", "4", "--repeats", "2",
                 "--hsd_buffers", "2,4", "--tree", "kary:3,2"])
  assert got["grid"] == {"target_only": {},
                         "token_v3": main_job.DEFAULT_GRID["token_v3"],
                         "hsd": {}}
  assert got["draft_rows"] == {"hsd": ("spec_decode", {"hierarchy": (2, 4)}),
                               "tree": ("spec_decode", {"tree": "kary:3,2"})}
  assert got["pairs"] == ["t5_codegen"]
  assert (got["temperature"], got["top_p"], got["gamma"]) == (
      [0.0, 0.5], [1.0, 0.9], [3, 5])
  assert (got["num_examples"], got["repeats"]) == (4, 2)
  assert "prompt_widths" not in got
  assert got["cache"] == str(tmp_path / "jax_cache")
  assert got["auto"] and got["auto_settings"].latency_budget == 0.8
  main_job.main(["--out_dir", str(tmp_path), "--no_auto",
                 "--auto_latency_budget", "0.5"])
  assert not got["auto"] and got["auto_settings"].latency_budget == 0.5
  with pytest.raises(SystemExit, match="not in the grid"):
    main_job.main(["--out_dir", str(tmp_path), "--methods", "nope"])
  with pytest.raises(SystemExit, match="--hsd_buffers: write comma-separated"
                     " integers such as 3,6; got '3;6'"):
    main_job.main(["--out_dir", str(tmp_path), "--hsd_buffers", "3;6"])


# Another default-models directory (e.g. a `tools/default_models/build.py --smoke`
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
  printed = []
  out = main_job.run_main_job(
      str(tmp_path), num_examples=2, progress=False, assets=ASSETS,
      grid={"target_only": {}, "spec_decode": {},
            "token_v3": {"alpha": [0.5]}, "hsd": {}},
      print_fn=printed.append, auto=False)
  rows = harness.load_rows(str(tmp_path / "results.jsonl"))
  # HSD runs on the families that have a medium model (all three sizes);
  # the others say why it is left out. (The tree row is covered on the
  # stand-ins: its compilation would add ~40 CPU s here.)
  three = {n: len(dm.load(n, **({"assets": ASSETS} if ASSETS else {})
                          ).levels()) == 3 for n in dm.PAIRS}
  assert len(rows) == sum(2 * (4 if three[n] else 3) for n in dm.PAIRS)
  for o in out["outcomes"]:
    assert bool(o.skipped) != three[o.name]
    if o.skipped:
      (line,) = o.skipped
      assert line.startswith("skipping HSD small>medium>large (3,6): "
                             "hierarchy=(3, 6) needs 3 levels")
      assert f"[{o.name}] {line}" in printed
  by = {(r["pair"], r["config_key"], r["example_id"]): r for r in rows}
  base = harness.RunConfig("target_only").key
  for (pair, key, ex), r in by.items():
    assert r["num_tokens"] > 0 and r["latency_s"] > 0
    # Greedy SpecDecode on the chain and the hierarchy: lossless, token for
    # token.
    if key.startswith("spec_decode["):
      assert r["tokens"] == by[(pair, base, ex)]["tokens"]
  for pair in dm.PAIRS:
    assert os.path.getsize(tmp_path / f"quality_vs_latency_{pair}.png") > 1000
  assert {s.pair for s in out["summary"]} == set(dm.PAIRS)


def test_examples_are_spread_over_the_split():
  pool = list(range(10))
  assert main_job.spread(pool, 3) == [0, 3, 6]
  assert main_job.spread(pool, 4) == [0, 2, 5, 7]
  assert main_job.spread(pool, 10) == pool
  assert main_job.spread(pool, 25) == pool and main_job.spread(pool, None) == pool
  # a split ordered by file: every file gets its share, not the first one
  files = [f"f{i // 25}" for i in range(100)]  # 4 files of 25 examples
  assert sorted(set(main_job.spread(files, 8))) == ["f0", "f1", "f2", "f3"]
  assert set(files[:8]) == {"f0"}
  with pytest.raises(ValueError, match="num_examples must be >= 1"):
    main_job.spread(pool, 0)


def test_num_examples_below_one_is_rejected(capsys):
  with pytest.raises(SystemExit):
    main_job.main(["--out_dir", "/tmp/mj_x", "--num_examples", "0"])
  assert "--num_examples must be >= 1, got 0" in capsys.readouterr().err
