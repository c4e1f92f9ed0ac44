"""In-process A/B/C of tree children drawing (one process, variants
alternating, recompiled each time): orig = 86818a9's rank-by-rank draws
(per-rank keys, no greedy path); batched = keys/uniforms in one batch, no
greedy path; cond = batched + the lax.cond greedy path. Run from the repo
root: python benchmarks/results/greedy_tree_children/inproc_variants.py 3"""
import sys, time, statistics, json
import jax, jax.numpy as jnp
from jax import lax
from specdec_jax import decoding
from specdec_jax.decoding.loops import tree_drafting
from specdec_jax.decoding.rules import sampling
from specdec_jax.decoding.verify import tree as tree_lib
from specdec_jax.eval import default_models
sys.path.insert(0, "scripts")
import bench_ab
REAL = tree_drafting.draw_children
def orig(kind, logits, sq, kids, slot_of, keys_at, c_max, cold=None):
  """86818a9's draw_children: the rank-by-rank draws, kept as _drawn_children."""
  return tree_drafting._drawn_children(kind, logits, sq, kids, slot_of, keys_at, c_max)
def batched(kind, logits, sq, kids, slot_of, keys_at, c_max, cold=None):
  """Every child's key and uniform in one batch, then the ranks (not adopted)."""
  b, npar, v = sq.shape
  if kind == "top_k":
    return lax.top_k(logits, c_max)[1].astype(jnp.int32)
  flat = lambda x: x.reshape((b * npar,) + x.shape[2:])
  slots = jnp.take_along_axis(slot_of, jnp.maximum(kids, 0).reshape(b, -1), axis=1)
  u = jax.vmap(jax.vmap(lambda k: jax.random.uniform(k, ())))(keys_at(slots)).reshape(b, npar, c_max)
  iota = jnp.arange(v)
  used = jnp.zeros((b, npar, v), bool)
  out = []
  for i in range(c_max):
    ui = u[..., i].reshape(-1)
    if kind == "iid" or i == 0:
      x = sampling.sample_at(ui, flat(sq)).reshape(b, npar)
    else:
      masked, mass = tree_lib.remaining(sq, used)
      drawn = sampling.sample_at(ui, flat(masked)).reshape(b, npar)
      best = sampling.argmax(jnp.where(used, -jnp.inf, logits))
      x = jnp.where(mass > 0, drawn, best)
    if kind != "iid" and i + 1 < c_max:
      used = used | (iota == x[..., None])
    out.append(x.astype(jnp.int32))
  return jnp.stack(out, axis=-1)
def batched_cond(kind, logits, sq, kids, slot_of, keys_at, c_max, cold=None):
  drawn = lambda: batched(kind, logits, sq, kids, slot_of, keys_at, c_max)
  if cold is None or kind == "top_k":
    return drawn()
  return lax.cond(cold, lambda: tree_drafting._greedy_children(kind, logits, c_max), drawn)
VARIANTS = {"orig": orig, "batched": batched, "cond": batched_cond}
CELLS = [("default-t5", "plan16", 1, 0.0), ("default-t5", "plan16", 1, 1.0), ("default-t5", "plan16", 8, 0.0),
         ("default-t5", "plan16", 8, 1.0), ("default-gemma", "plan16", 1, 0.0), ("default-gemma", "plan16", 1, 1.0),
         ("default-t5", "2x3", 1, 0.0), ("default-t5", "2x3", 1, 1.0)]
rounds = int(sys.argv[1])
pairs = {f: default_models.load_pair_for_benchmark(f, limit=8) for f in ("default-t5", "default-gemma")}
res = {}
for r in range(rounds):
  for fam, case, b, t in CELLS:
    bp = pairs[fam]; q, p, qp, pp = bp
    topo = decoding.Topology(bench_ab.PLAN16[fam]) if case == "plan16" else decoding.Topology.kary(2, 3)
    rows = {k: v[:b] for k, v in (("prompts", bp.prompts), ("inputs", bp.inputs)) if v}
    s = decoding.Greedy() if t == 0 else decoding.Temperature(t)
    order = list(VARIANTS) if r % 2 == 0 else list(VARIANTS)[::-1]
    key = f"{fam}|{case}|b{b}|T{t:g}"
    for variant in order:
      tree_drafting.draw_children = VARIANTS[variant]
      decoding.clear_compiled()
      call = lambda: decoding.generate(decoding.make_method("spec_decode"), q, p, qp, pp, sampling=s,
                                       max_new_tokens=32, seeds=list(range(b)), eos_id=None, tree=topo, **rows)
      out = call(); jax.block_until_ready(out.tokens)
      times = []
      for _ in range(5):
        t0 = time.perf_counter(); out = call(); jax.block_until_ready(out.tokens); times.append(time.perf_counter() - t0)
      res.setdefault(key, {}).setdefault(variant, []).append(statistics.median(times))
      res[key]["tokens_" + variant] = [list(map(int, x)) for x in out.sequences()]
    print(key, r, {v: round(res[key]["orig"][-1] / res[key][v][-1], 3) for v in VARIANTS}, flush=True)
tree_drafting.draw_children = REAL
print("| cell | orig ms/call | batched | batched + greedy cond | speed vs orig per round: batched | cond | median batched | median cond | same tokens |")
print("|---|---|---|---|---|---|---|---|---|")
for k, v in res.items():
  rb = [a / b for a, b in zip(v["orig"], v["batched"])]; rc = [a / b for a, b in zip(v["orig"], v["cond"])]
  same = v["tokens_orig"] == v["tokens_batched"] == v["tokens_cond"]
  print(f"| {k} | {statistics.median(v['orig'])*1e3:.1f} | {statistics.median(v['batched'])*1e3:.1f} | {statistics.median(v['cond'])*1e3:.1f} | "
        f"{', '.join(f'{x:.2f}' for x in rb)} | {', '.join(f'{x:.2f}' for x in rc)} | {statistics.median(rb):.3f} | {statistics.median(rc):.3f} | {same} |")
json.dump(res, open("inproc_variants.json", "w"))
