"""In-process A/B of the greedy-children path: 'before' patches
tree_drafting.draw_children to ignore ``cold`` (the rank-by-rank draws),
'after' is the code as is. Alternating variants in one process, programs
recompiled each time (clear_compiled), medians over repeats. Run from the
repo root at 3e5e78e or later: python
benchmarks/results/greedy_tree_children/inproc_ab.py default-t5,default-gemma 1,8 0,1 3"""
import sys, time, statistics, json
import jax
from specdec_jax import decoding
from specdec_jax.decoding.loops import tree_drafting
from specdec_jax.eval import default_models
sys.path.insert(0, "scripts")
import bench_ab
REAL = tree_drafting.draw_children
def before(*a, cold=None, **k):
  if len(a) > 7:
    a = a[:7]
  return REAL(*a, **k)
fams = sys.argv[1].split(","); batches = [int(x) for x in sys.argv[2].split(",")]
temps = [float(x) for x in sys.argv[3].split(",")]; rounds = int(sys.argv[4])
pairs = {f: default_models.load_pair_for_benchmark(f, limit=8) for f in fams}
res = {}
for r in range(rounds):
  for fam in fams:
    q, p, qp, pp = pairs[fam]; bp = pairs[fam]
    for case in ("plan16", "2x3"):
      topo = decoding.Topology(bench_ab.PLAN16[fam]) if case == "plan16" else decoding.Topology.kary(2, 3)
      for b in batches:
        rows = {k: v[:b] for k, v in (("prompts", bp.prompts), ("inputs", bp.inputs)) if v}
        for t in temps:
          s = decoding.Greedy() if t == 0 else decoding.Temperature(t)
          for variant in (("before", "after") if r % 2 == 0 else ("after", "before")):
            tree_drafting.draw_children = before if variant == "before" else REAL
            decoding.clear_compiled()
            call = lambda: decoding.generate(decoding.make_method("spec_decode"), q, p, qp, pp, sampling=s,
                                             max_new_tokens=32, seeds=list(range(b)), eos_id=None, tree=topo, **rows)
            out = call(); jax.block_until_ready(out.tokens)
            times = []
            for _ in range(5):
              t0 = time.perf_counter(); out = call(); jax.block_until_ready(out.tokens); times.append(time.perf_counter() - t0)
            key = f"{fam}|{case}|b{b}|T{t:g}"
            res.setdefault(key, {}).setdefault(variant, []).append(statistics.median(times))
            res[key].setdefault("tokens_" + variant, [list(map(int, x)) for x in out.sequences()])
          k = f"{fam}|{case}|b{b}|T{t:g}"
          print(k, r, "after/before speed", round(res[k]["before"][-1] / res[k]["after"][-1], 3), flush=True)
tree_drafting.draw_children = REAL
print("| cell | before ms/call | after ms/call | speed after/before per round | median | same tokens |")
print("|---|---|---|---|---|---|")
for k, v in res.items():
  ratios = [a / b for a, b in zip(v["before"], v["after"])]
  print(f"| {k} | {statistics.median(v['before'])*1e3:.1f} | {statistics.median(v['after'])*1e3:.1f} | "
        f"{', '.join(f'{x:.2f}' for x in ratios)} | {statistics.median(ratios):.3f} | {v['tokens_before'] == v['tokens_after']} |")
json.dump(res, open("inproc_ab.json", "w"))
