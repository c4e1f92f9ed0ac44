"""Does the cost model's fit time target-only differently from the check?

``tune_measure.at_workload`` / ``fit_chains`` time target-only's 16-token
decode interleaved with the models' step timers (jitted loops); the cost
model check (``DecodeMeasurer.measure``) times the same decode back to back
with a speculative one. Per round, the same held-out rows of a default
family, as ``scripts/cost_model_check.py`` builds them: the 'full' timer
interleaved with the step timers ('interleaved_full'), alone
('alone_full'), and inside ``measure`` ('measure_to'); seconds per pass
over the rows. Usage (from the repository root):

  python benchmarks/results/cost_model_drift/to_bias.py default-t5 1 0
"""
import os
import statistics
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "../../.."))
sys.path[:0] = [ROOT, os.path.join(ROOT, "scripts")]

import bench_auto  # pylint: disable=g-import-not-at-top,wrong-import-position
from specdec_jax import decoding, timing  # pylint: disable=wrong-import-position
from specdec_jax.decoding import Chain  # pylint: disable=wrong-import-position
from specdec_jax.decoding.planners import tune_measure  # pylint: disable=wrong-import-position
from specdec_jax.decoding.planners.tuning import Candidate  # pylint: disable=wrong-import-position


def main(pair="default-t5", batch="1", temp="0", rounds=3):
  b, temp = int(batch), float(temp)
  levels, prompts, enc = bench_auto.load_levels(pair, 12)
  levels = [levels[0], levels[-1]]
  ms, ps = [m for m, _ in levels], [p for _, p in levels]
  ho = tune_measure.DecodeMeasurer(ms, ps, prompts[4:], enc, 16,
                                   decoding.Temperature(temp), 3, seed=100,
                                   min_seconds=0.5)
  res = {k: [] for k in ("interleaved_full", "alone_full", "measure_to",
                         "short", "fixed")}
  for rnd in range(rounds):
    timers = ho.split_timers(b)
    timers.update(tune_measure.call_timers(ho, (0, 1), b, range(1, 10)))
    med = timing.medians(timers, 3)
    res["interleaved_full"].append(med["full"])
    res["short"].append(med["short"])
    res["fixed"].append(tune_measure.target_only_split(ho, med, b)[0])
    res["alone_full"].append(timing.medians(ho.split_timers(b), 3)["full"])
    m = ho.measure([Candidate("spec_decode", Chain(3), (0, 1))], b)
    res["measure_to"].append(len(ho._rows(b)) * 16 / m[0].tps)  # pylint: disable=protected-access
    print(rnd, {k: round(v[-1] * 1e3, 1) for k, v in res.items()},
          flush=True)
  print("medians ms", {k: round(statistics.median(v) * 1e3, 1)
                       for k, v in res.items()})


if __name__ == "__main__":
  main(*sys.argv[1:])
