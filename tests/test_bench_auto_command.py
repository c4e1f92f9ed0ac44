"""scripts/bench_auto.py: the command its report records runs as is; its
held-out predictions are tune's chain fit moved to the held-out rows."""

import pytest

from specdec_jax import decoding
from specdec_jax.decoding.planners.auto import Candidate
from specdec_jax.decoding.verify.topology import Topology
from tests import load_script
from tests.planners.test_at_workload import simulated


def test_command_line_parses_back_to_the_same_arguments():
  mod = load_script("bench_auto", "bench_auto_under_test")
  parse = lambda argv: mod.build_parser().parse_args(argv)
  for argv in (["--pairs=random-gemma"], ["--no_hierarchy", "--repeats=2"]):
    args = parse(argv)
    line = mod.command_line(args)
    assert line.startswith("python scripts/bench_auto.py ")
    assert vars(parse(line.split()[2:])) == vars(args)
  assert "--no_hierarchy" not in mod.command_line(parse([]))


def test_held_out_prices_are_the_tune_fit_moved(monkeypatch):
  mod = load_script("bench_auto", "bench_auto_under_test")
  cal_truth, work_truth, cal, work = simulated(monkeypatch)
  spec = lambda s: Candidate("spec_decode", s, (0, 1))
  cands = [Candidate("target_only", decoding.Chain(1), (1,)),
           spec(decoding.Chain(3)), spec(decoding.Chain(5)),
           spec(decoding.Tree(Topology.kary(2, 2)))]
  cal.fits = {}
  assert mod.at_workload(cal, work, 2, cands) == {}  # tune did not price
  cal.fits = {2: (cal_truth, ((3, 0.8), (7, 0.8)))}
  got = mod.at_workload(cal, work, 2, cands)
  assert set(got) == set(cands[:3])  # the tree is not priced
  assert got[cands[0]] == pytest.approx(
      2 * 16 / work_truth.target_only_decode(16))
  for c, g in zip(cands[1:3], (3, 5)):  # workload alpha: 0.8 x 0.9
    assert got[c] == pytest.approx(
        2 * 16 / work_truth.chain_decode(0.72, g, 16))


def test_predicted_counts_within_ten_percent():
  mod = load_script("bench_auto", "bench_auto_under_test")
  cand = lambda tps, p, c: dict(tps=tps, predicted_tps=p,
                                predicted_calibration_tps=c)
  rows = [dict(auto_tps=100.0, predicted_tps=109.0,
               predicted_calibration_tps=150.0,
               candidates=[cand(100.0, 109.0, 150.0), cand(50.0, 40.0, 51.0),
                           cand(30.0, None, None)]),
          dict(auto_tps=200.0, predicted_tps=None,
               predicted_calibration_tps=None, candidates=[])]
  assert mod.predicted_counts(rows) == (
      "Predicted tokens/s within 10% of the held-out measurement: auto's "
      "choice 1/1 (tune's calibration figure: 0/1); every priced candidate "
      "1/2 (calibration figure: 1/2).\n")
