"""The main job's auto rows: Candidate -> RunConfig, rows, labels, resume."""

import dataclasses
import json

import pytest

from specdec_jax import decoding, program_cache
from specdec_jax.decoding.planners import auto
from specdec_jax.eval import auto_rows, harness, main_job
from tests.eval import test_harness as th
from tests.planners.test_auto import FakeMeasurer

Cand = auto.Candidate
FIELDS = dict(temperature=0.0, top_p=1.0, max_new_tokens=None, batch_size=1,
              seed=0)


def test_candidates_map_to_the_sweeps_configs():
  conv = lambda c, n=2: auto_rows.to_run_config(c, n, **FIELDS)
  kary = lambda k, d, **kw: decoding.Tree(decoding.Topology.kary(k, d), **kw)
  assert conv(Cand("target_only", decoding.Chain(1), (1,))) == \
      harness.RunConfig("target_only")
  assert conv(Cand("spec_decode", decoding.Chain(4), (0, 1))) == \
      harness.RunConfig("spec_decode", gamma=4)
  assert conv(Cand("spec_decode", kary(2, 3), (0, 2)), 3) == \
      harness.RunConfig("spec_decode", tree="kary:2,3")
  assert conv(Cand("spec_decode", kary(2, 2, proposal="iid"), (0, 1))).tree \
      == "kary:2,2/iid"
  chain_tree = decoding.Tree(decoding.Topology.chain(4))
  assert conv(Cand("spec_decode", chain_tree, (0, 1))).tree == "chain:4"
  assert conv(Cand("spec_decode", decoding.Stack((3, 6)), (0, 1, 2)), 3) == \
      harness.RunConfig("spec_decode", hierarchy=(3, 6))
  cascade = Cand("token_v3", decoding.Chain(5), (0, 1), (("alpha", 0.5),))
  cfg = conv(cascade)
  assert cfg == harness.RunConfig("token_v3", {"alpha": 0.5}, gamma=5)
  assert auto_rows.describe(cfg) == "SpecCascade [TokenV3] gamma=5 alpha=0.5"
  # The harness drafts with level 0 and runs hierarchies over every level.
  with pytest.raises(ValueError, match=r"chain:4@1: the harness drafts with "
                     r"the pair's drafter \(level 0\)"):
    conv(Cand("spec_decode", decoding.Chain(4), (1, 2)), 3)
  with pytest.raises(ValueError, match="over all 3 levels"):
    conv(Cand("spec_decode", decoding.Stack((3,)), (0, 2)), 3)
  odd = decoding.Tree(decoding.Topology((-1, -1, 0)))
  with pytest.raises(ValueError, match="k-ary and chain trees only"):
    conv(Cand("spec_decode", odd, (0, 1)))


def test_calibration_examples_come_from_the_dev_split():
  pool = {"validation": [dict(id=f"v{i}") for i in range(8)],
          "train": [dict(id=f"t{i}") for i in range(8)]}
  said = []
  s = auto_rows.AutoSettings(num_examples=3)
  got, split = auto_rows.calibration_examples(
      lambda n, sp: pool[sp], "p", s, said.append)
  assert ([e["id"] for e in got], split) == (["v0", "v2", "v5"],
                                             "validation")

  def no_dev(name, split):
    if split != "train":
      raise ValueError(f"no split {split}")
    return pool["train"]

  got, split = auto_rows.calibration_examples(no_dev, "p", s, said.append)
  assert ([e["id"] for e in got], split) == (["t0", "t1", "t2"], "train")
  assert said == ["[p] auto: no validation split; tuning on the first 3 "
                  "train examples"]
  with pytest.raises(ValueError, match="latency_budget must be a number"):
    auto_rows.AutoSettings(latency_budget=0)


class _Refuse:

  def measure(self, cands, batch):
    raise AssertionError("a resumed job must not tune again")


@pytest.fixture(scope="module")
def tiny_a():
  return th.three_levels(th.stand_in_pair("t5", name="tiny_a"))


def test_auto_rows_with_injected_measurements_and_resume(tiny_a, tmp_path):
  # auto: chain:2 is fastest (1.2x; not in the grid: one more config
  # measured), but not within the budget of the quality row;
  # quality budget 0.8 (>= 1.25x): token_v3 alpha=0.3 has the best quality
  # within it (a grid config: nothing extra).
  fake = FakeMeasurer({1: {"chain:2": (1.2, 1.0),
                           "token_v3(alpha=0.3) chain:3": (1.3, 0.99),
                           "token_v3(alpha=0.9) chain:3": (1.9, 0.9)}})
  printed = []
  grid = {"target_only": {}, "spec_decode": {},
          "token_v3": {"alpha": [0.3, 0.9]}}
  kw = dict(pairs=("tiny_a",), num_examples=2, grid=grid, gamma=3,
            progress=False, load_pair=lambda name, dtype: tiny_a,
            load_examples=lambda name, split: th.stand_in_examples(4),
            print_fn=printed.append)
  out = main_job.run_main_job(str(tmp_path), auto_measurer=fake, **kw)
  want = {"auto": harness.RunConfig("spec_decode", gamma=2),
          "auto (quality budget)": harness.RunConfig(
              "token_v3", {"alpha": 0.3}, gamma=3)}
  assert [r["label"] for r in out["auto"]] == list(want)
  (outcome,) = out["outcomes"]
  assert outcome.configs == 5  # 4 of the grid + SpecDecode gamma=2
  # The stack candidate is the job's 'hsd' buffers (tiny_a has 3 levels);
  # the cascades run on the job's gamma with the grid's alphas.
  asked = {label for _, labels in fake.asked for label in labels}
  assert {"stack:3,6", "token_v3(alpha=0.3) chain:3", "tree:6n/d2",
          "tree:14n/d3"} <= asked
  rows = harness.load_rows(str(tmp_path / "results.jsonl"))
  aggs = {a.config: a for a in out["aggregates"]}
  for r in out["auto"]:
    cfg = want[r["label"]]
    assert r["config_key"] == cfg.key
    assert r["resolved"] == auto_rows.describe(cfg)
    assert sum(x["config_key"] == cfg.key for x in rows) == 2  # measured
    assert r["relative_latency"] == aggs[cfg].relative_latency
    assert r["quality"] == aggs[cfg].score and not r["reused"]
  assert out["auto"][0]["tune_ratio"] == pytest.approx(1.2)
  assert out["auto"][1]["latency_budget"] == 0.8
  md = (tmp_path / "summary.md").read_text()
  assert "## auto rows" in md
  assert "| tiny_a | auto | SpecDecode gamma=2 |" in md
  assert "| tiny_a | auto (quality budget) | SpecCascade [TokenV3] gamma=3 " \
      "alpha=0.3 |" in md
  with open(tmp_path / "summary.json") as f:
    assert [r["label"] for r in json.load(f)["auto"]] == list(want)
  for objective in ("latency", "quality"):
    table = auto.load(str(tmp_path / f"auto_tiny_a_{objective}.gin"))
    assert table.objective == objective
  # A resumed job reads the tables back: no tune, no decode.
  again = main_job.run_main_job(str(tmp_path), auto_measurer=_Refuse(), **kw)
  assert [r["config_key"] for r in again["auto"]] == [
      r["config_key"] for r in out["auto"]]
  assert all(r["reused"] for r in again["auto"])
  assert again["outcomes"][0].run.written == 0
  assert "[tiny_a] auto tables reused in" in " ".join(printed)
  # Off: no tune, no auto rows, the grid alone.
  off = main_job.run_main_job(str(tmp_path / "off"), auto=False, **kw)
  assert off["auto"] == [] and off["outcomes"][0].configs == 4


def test_auto_rows_end_to_end_on_a_tiny_pair(tmp_path):
  """A real (small) tune: the rows resolve to configs the sweep measured;
  with the user store on, a job with a fresh directory reads them back."""
  pair = dataclasses.replace(th.stand_in_pair("t5"), name="tiny_e2e")
  settings = auto_rows.AutoSettings(num_examples=2, gammas=(3,), trees=(),
                                    alphas=(0.5,), new_tokens=4, repeats=1,
                                    price=False)
  printed = []
  grid = {"target_only": {}, "spec_decode": {}}
  load_examples = lambda name, split: th.stand_in_examples(4)
  out = main_job.run_main_job(
      str(tmp_path), pairs=("tiny_e2e",), num_examples=2, grid=grid,
      gamma=3, progress=False, load_pair=lambda name, dtype: pair,
      load_examples=load_examples, print_fn=printed.append,
      auto_settings=settings)
  job = dict(temperature=0.0, top_p=1.0, gamma=3, max_new_tokens=None,
             batch_size=1, seed=0)  # run_main_job's
  program_cache.enable(str(tmp_path / "store"))
  try:
    tuned, again = (auto_rows.tune_for_job(
        pair, load_examples, str(tmp_path / d), settings, grid,
        main_job.DRAFT_ROWS, None, printed.append, **job)
                    for d in ("first", "second"))
  finally:
    program_cache.enable(None)
  assert tuned.from_store == () and again.configs == tuned.configs
  assert set(again.from_store) == set(auto_rows.LABELS)
  assert again.tables == tuned.tables
  assert [r["label"] for r in out["auto"]] == ["auto",
                                               "auto (quality budget)"]
  keys = {r["config_key"] for r in harness.load_rows(
      str(tmp_path / "results.jsonl"))}
  for r in out["auto"]:
    assert r["config_key"] in keys and r["quality"] is not None
    assert r["relative_latency"] is not None and r["tune_s"] > 0
  assert "[tiny_e2e] auto tables tuned on validation examples" in \
      " ".join(printed)
  assert "[tiny_e2e] auto tables reused in" in printed[-1]
  print("tune seconds:", [r["tune_s"] for r in out["auto"]])
