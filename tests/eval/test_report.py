"""Report: aggregation, the paper's two summary numbers, tables and plots."""

import json
import os

import pytest

from specdec_jax.eval import harness, plots, report


def exact_match(names, targets, predictions):
  """A trivial metric: percent of predictions equal to their target."""
  score = 100.0 * sum(t == p for t, p in zip(targets, predictions)) / len(
      targets)
  return {n: score for n in names}


def make_row(cfg, ex_id, pred, latency, tokens=4, drafted=0, accepted=0,
             verifier_calls=4, deferrals=0.0, pair="p"):
  return dict(key=harness.row_key(pair, cfg, ex_id), pair=pair,
              config_key=cfg.key, config=cfg.to_json(), example_id=ex_id,
              prediction=pred, num_tokens=tokens, latency_s=latency,
              drafted=drafted, accepted=accepted,
              verifier_calls=verifier_calls, drafter_calls=drafted,
              deferrals=deferrals)


TARGETS = {"a": "x", "b": "y", "c": "z", "d": "w"}


# ---------------------------------------------------------------- aggregate


def test_aggregate_hand_computed():
  base = harness.RunConfig("target_only")
  casc = harness.RunConfig("token_v3", {"alpha": 0.3})
  rows = [make_row(base, i, TARGETS[i], 1.0) for i in "abcd"]
  rows += [
      make_row(casc, "a", "x", 0.5, tokens=6, drafted=10, accepted=6,
               verifier_calls=2, deferrals=1.0),
      make_row(casc, "b", "WRONG", 0.3, tokens=4, drafted=5, accepted=3,
               verifier_calls=2, deferrals=0.5),
  ]
  aggs = report.aggregate(rows, TARGETS, ["em"], metric_fn=exact_match)
  t, c = aggs
  assert (t.method, t.score, t.relative_latency) == ("target_only", 100.0,
                                                     1.0)
  assert t.mean_latency_s == 1.0 and t.tokens_per_s == 4.0
  assert t.acceptance_rate is None  # no drafts
  assert c.num_examples == 2 and c.score == 50.0
  # Relative latency over the SAME examples: (0.5 + 0.3) / (1 + 1).
  assert c.relative_latency == pytest.approx(0.4)
  assert c.mean_latency_s == pytest.approx(0.4)
  assert c.tokens_per_s == pytest.approx(10 / 0.8)
  assert c.acceptance_rate == pytest.approx(9 / 15)
  assert c.deferral_rate == pytest.approx(1.5 / 10)
  assert c.block_efficiency == pytest.approx(10 / 4)
  assert c.mean_tokens == 5.0
  assert c.alpha is None  # rows without rejections (older results files)


def test_alpha_counts_accept_tests_passed():
  casc = harness.RunConfig("spec_decode")
  rows = [make_row(casc, "a", "x", 0.5, drafted=10, accepted=6),
          make_row(casc, "b", "y", 0.5, drafted=5, accepted=3)]
  rows[0]["rejected"], rows[1]["rejected"] = 2, 1
  (c,) = report.aggregate(rows, TARGETS, ["em"], metric_fn=exact_match)
  # 9 drafts accepted, 3 rounds ended by a rejection: 9 / 12 tests passed;
  # the gamma-dependent rate (accepted / drafted) stays 9 / 15.
  assert c.alpha == pytest.approx(9 / 12)
  assert c.acceptance_rate == pytest.approx(9 / 15)
  text = report.results_table([c])
  assert "| 0.60 | 0.75 |" in text


def test_baseline_is_matched_on_sampling_settings():
  rows = [make_row(harness.RunConfig("target_only", temperature=t), "a", "x",
                   lat) for t, lat in ((0.0, 1.0), (1.0, 4.0))]
  rows += [make_row(harness.RunConfig("chow", {"alpha": 0.1},
                                      temperature=1.0), "a", "x", 2.0),
           make_row(harness.RunConfig("chow", {"alpha": 0.1},
                                      temperature=0.5), "a", "x", 2.0)]
  aggs = report.aggregate(rows, TARGETS, ["em"], metric_fn=exact_match)
  rel = {(a.method, a.config.temperature): a.relative_latency for a in aggs}
  assert rel[("chow", 1.0)] == 0.5  # against target-only at T=1, not T=0
  assert rel[("chow", 0.5)] is None  # no target-only at T=0.5


def test_aggregate_needs_targets():
  rows = [make_row(harness.RunConfig("target_only"), "zz", "x", 1.0)]
  with pytest.raises(ValueError, match=r"no targets for examples \['zz'\]"):
    report.aggregate(rows, TARGETS, ["em"], metric_fn=exact_match)


def test_aggregate_with_real_metrics():
  rows = [make_row(harness.RunConfig("target_only"), "a",
                   "the cat sat on the mat", 1.0)]
  aggs = report.aggregate(rows, {"a": "the cat sat on the mat"},
                          ["rouge2", "bleu"])
  assert aggs[0].quality == pytest.approx({"rouge2": 100.0, "bleu": 100.0})
  assert aggs[0].metric == "rouge2"


# ---------------------------------------------------------------- numbers


def test_matched_quality_interpolates_between_bracketing_points():
  pts = [(0.7, 35.0), (0.3, 10.0), (0.5, 30.0)]  # unsorted on purpose
  # Sorted: (0.3, 10), (0.5, 30): 20 is reached half-way: 0.3 + 0.5 * 0.2.
  assert report.matched_quality_latency(pts, 20.0) == pytest.approx(0.4)
  assert report.matched_quality_latency(pts, 20.0,
                                        interpolate=False) == 0.5
  # The first point already reaches it: no interpolation below it.
  assert report.matched_quality_latency(pts, 5.0) == 0.3
  # Exactly at a point.
  assert report.matched_quality_latency(pts, 30.0) == pytest.approx(0.5)
  # Never reached: None (no extrapolation).
  assert report.matched_quality_latency(pts, 36.0) is None
  assert report.matched_quality_latency([], 1.0) is None


def test_matched_quality_takes_the_first_crossing_of_a_wiggly_curve():
  pts = [(0.2, 5.0), (0.4, 25.0), (0.6, 15.0), (0.9, 40.0)]
  # Crosses 20 first between 0.2 and 0.4: 0.2 + 15/20 * 0.2 = 0.35.
  assert report.matched_quality_latency(pts, 20.0) == pytest.approx(0.35)
  # 30 is first reached between 0.6 and 0.9: 0.6 + 15/25 * 0.3 = 0.78.
  assert report.matched_quality_latency(pts, 30.0) == pytest.approx(0.78)


def test_best_quality_within_latency():
  pts = [(0.3, 10.0), (0.9, 34.0), (1.0, 34.0), (1.2, 50.0)]
  assert report.best_quality_within(pts, 1.0) == (34.0, 0.9)  # tie: faster
  assert report.best_quality_within(pts, 0.2) is None
  assert report.best_quality_within([(None, 3.0)], 1.0) is None


def hand_made_aggregates():
  """One setting: target 20.0 at latency 1; three method curves."""
  def agg(method, knobs, rel, score, gamma=5):
    cfg = harness.RunConfig(method, knobs, gamma=gamma)
    return report.Aggregate(
        pair="p", config=cfg, num_examples=10, quality={"bleu": score},
        metric="bleu", mean_latency_s=rel * 0.2, relative_latency=rel,
        tokens_per_s=100.0 / rel, mean_tokens=20.0, acceptance_rate=None,
        deferral_rate=None, block_efficiency=None)
  return [
      agg("target_only", {}, 1.0, 20.0),
      agg("drafter_only", {}, 0.2, 12.0),
      agg("spec_decode", {}, 0.6, 20.0),
      agg("token_v3", {"alpha": 0.1}, 0.5, 30.0),
      agg("token_v3", {"alpha": 0.5}, 0.3, 10.0),
      agg("token_v3", {"alpha": 0.0}, 0.7, 35.0),
      agg("chow", {"alpha": 0.2}, 0.4, 15.0),
      agg("chow", {"alpha": 0.9}, 1.1, 19.0),
  ]


def test_summarize_known_answers():
  summ = {s.method: s for s in report.summarize(hand_made_aggregates())}
  t = summ["token_v3"]
  assert t.target_quality == 20.0 and t.num_points == 3
  assert t.speedup_matched == pytest.approx(1 / 0.4)  # 2.5x interpolated
  assert t.speedup_matched_point == pytest.approx(1 / 0.5)
  assert t.matched_knobs == "alpha=0.1"
  assert (t.best_quality, t.best_quality_latency, t.best_knobs) == (
      35.0, 0.7, "alpha=0")
  s = summ["spec_decode"]
  assert s.speedup_matched == pytest.approx(1 / 0.6)
  assert s.best_quality == 20.0
  c = summ["chow"]  # never reaches 20; only one point within latency 1
  assert c.speedup_matched is None and c.speedup_matched_point is None
  assert (c.best_quality, c.best_knobs) == (15.0, "alpha=0.2")
  assert summ["target_only"].speedup_matched == 1.0
  assert summ["drafter_only"].speedup_matched is None
  assert summ["drafter_only"].best_quality == 12.0


def test_write_summary_json_and_markdown(tmp_path):
  aggs = hand_made_aggregates()
  summ = report.summarize(aggs)
  js, md = report.write_summary(str(tmp_path), aggs, summ,
                                extra=dict(note="x"))
  with open(js) as f:
    data = json.load(f)
  assert data["note"] == "x"
  got = {s["method"]: s for s in data["summary"]}
  assert got["token_v3"]["speedup_matched"] == pytest.approx(2.5)
  assert got["chow"]["speedup_matched"] is None
  assert got["chow"]["setting"] == dict(pair="p", temperature=0.0, top_p=1.0,
                                        max_new_tokens=None, batch_size=1,
                                        seed=0)
  assert len(data["aggregates"]) == len(aggs)
  text = open(md).read()
  assert "| token_v3 | 5 | 3 | 2.50x | 2.00x | alpha=0.1 | 35.00 | 0.70 | " \
         "alpha=0 |" in text
  assert "| chow | 5 | 2 | not reached | not reached | - | 15.00 |" in text
  assert "| token_v3 | 5 | alpha=0.5 | 10.00 | 0.30 |" in text


# ---------------------------------------------------------------- plots


def test_plot_draws_exactly_the_aggregates(tmp_path):
  aggs = hand_made_aggregates()
  path = str(tmp_path / "fig.png")
  drawn = plots.plot_quality_vs_latency(aggs, path)
  assert os.path.getsize(path) > 1000
  with open(path, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  assert drawn["SpecCascade [TokenV3]"] == ([0.3, 0.5, 0.7],
                                           [10.0, 30.0, 35.0])
  assert drawn["SpecCascade [Chow]"] == ([0.4, 1.1], [15.0, 19.0])
  assert drawn["Target only (large)"] == ([1.0], [20.0])
  assert drawn["Drafter only (small)"] == ([0.2], [12.0])
  assert drawn["SpecDecode"] == ([0.6], [20.0])
  assert drawn[plots.TARGET_LINE][1] == [20.0, 20.0]
  assert len(drawn) == 6


def test_plot_labels_gamma_when_swept(tmp_path):
  aggs = hand_made_aggregates()
  extra = report.Aggregate(
      pair="p", config=harness.RunConfig("token_v3", {"alpha": 0.1},
                                         gamma=3),
      num_examples=10, quality={"bleu": 25.0}, metric="bleu",
      mean_latency_s=0.1, relative_latency=0.45, tokens_per_s=1.0,
      mean_tokens=1.0, acceptance_rate=None, deferral_rate=None,
      block_efficiency=None)
  drawn = plots.plot_quality_vs_latency(aggs + [extra],
                                        str(tmp_path / "g.png"))
  assert drawn["SpecCascade [TokenV3] (gamma=3)"] == ([0.45], [25.0])
  assert drawn["SpecCascade [TokenV3] (gamma=5)"][0] == [0.3, 0.5, 0.7]


def draft_aggregates():
  """hand_made_aggregates plus SpecDecode on a hierarchy and on a tree."""
  def agg(cfg, rel, score):
    return report.Aggregate(
        pair="p", config=cfg, num_examples=10, quality={"bleu": score},
        metric="bleu", mean_latency_s=rel * 0.2, relative_latency=rel,
        tokens_per_s=1.0, mean_tokens=20.0, acceptance_rate=None,
        deferral_rate=None, block_efficiency=None)
  return hand_made_aggregates() + [
      agg(harness.RunConfig("spec_decode", hierarchy=(3, 6)), 0.5, 20.0),
      agg(harness.RunConfig("spec_decode", tree="kary:2,3"), 0.8, 20.0)]


def test_hierarchy_and_tree_are_curves_of_their_own(tmp_path):
  aggs = draft_aggregates()
  (by_curve,) = report.curves(aggs).values()
  assert [k for k in by_curve if k[0] == "spec_decode"] == [
      ("spec_decode", 5, ""), ("spec_decode", 0, "hierarchy=3,6"),
      ("spec_decode", 0, "tree=kary:2,3")]
  summ = {(s.method, s.draft): s for s in report.summarize(aggs)}
  hsd = summ[("spec_decode", "hierarchy=3,6")]
  assert hsd.label == "HSD small>medium>large (3,6)" and hsd.gamma == 0
  assert hsd.speedup_matched == pytest.approx(2.0)  # lossless: 1 / 0.5
  tree = summ[("spec_decode", "tree=kary:2,3")]
  assert tree.label == "SpecDecode tree 2x3"
  assert tree.speedup_matched == pytest.approx(1.25)
  assert tree.to_json()["draft"] == "tree=kary:2,3"
  assert summ[("spec_decode", "")].speedup_matched == pytest.approx(1 / 0.6)
  table = report.summary_table(report.summarize(aggs))
  assert "| HSD small>medium>large (3,6) | - | 1 | 2.00x | 2.00x | - | " \
         "20.00 | 0.50 | - |" in table
  assert "| SpecDecode tree 2x3 | - | 1 | 1.25x |" in table
  assert "| spec_decode | 5 | 1 |" in table
  results = report.results_table(aggs)
  assert "| SpecDecode tree 2x3 | - | - | 20.00 | 0.80 |" in results
  drawn = plots.plot_quality_vs_latency(aggs, str(tmp_path / "d.png"))
  assert drawn["HSD small>medium>large (3,6)"] == ([0.5], [20.0])
  assert drawn["SpecDecode tree 2x3"] == ([0.8], [20.0])
  assert drawn["SpecDecode"] == ([0.6], [20.0])  # one chain gamma: no tag
  assert len(drawn) == 8


def test_plot_refuses_mixed_settings(tmp_path):
  aggs = hand_made_aggregates()
  other = report.Aggregate(
      pair="q", config=harness.RunConfig("target_only"), num_examples=1,
      quality={"bleu": 1.0}, metric="bleu", mean_latency_s=1.0,
      relative_latency=1.0, tokens_per_s=1.0, mean_tokens=1.0,
      acceptance_rate=None, deferral_rate=None, block_efficiency=None)
  with pytest.raises(ValueError, match="plot one setting at a time"):
    plots.plot_quality_vs_latency(aggs + [other], str(tmp_path / "x.png"))
  paths = plots.plot_all(aggs + [other], str(tmp_path))
  assert [os.path.basename(p) for p in paths] == [
      "quality_vs_latency_p.png", "quality_vs_latency_q.png"]
  assert all(os.path.getsize(p) > 1000 for p in paths)
