"""The main job: every method of the paper on the built-in default pairs.

For each default pair (``default_models.PAIRS``) on its held-out test split:
target-only, drafter-only, SpecDecode, Lossy (beta = 1 and tuned beta), BiLD,
BiLD*, SpecCascade [Chow / Diff / OPT / TokenV1 / V2 / V3], TokenCascade
[Chow] and SeqCascade [Chow], each cascade / lossy method over a small alpha
grid, plus two draft structures beside the chain of gamma: hierarchical
speculative decoding over the family's three sizes ('hsd': small > medium >
large, buffers ``HSD_BUFFERS``; only for pairs with a medium model) and
SpecDecode on a token tree ('tree': ``TREE_SPEC``); greedy decoding
(temperature 0) at batch 1 and gamma 5 by default. Writes into ``out_dir``:

    results.jsonl                 one row per (pair, config, example); resumable
    summary.json, summary.md      aggregates + the paper's two summary numbers
    timings.jsonl                 compile / decode seconds of every invocation
    quality_vs_latency_<pair>.png Figure-4-style plot per pair
    auto_<pair>_<objective>.gin   the auto rows' tune tables (auto_rows.py)

and prints the results and summary tables. Rerunning with the same
``out_dir`` resumes (rows already measured are skipped).

    python -m specdec_jax.eval.main_job --out_dir /tmp/main_job
    python -m specdec_jax.eval.main_job --out_dir /tmp/mj --num_examples 8 \\
        --pairs t5_codegen --temperature 0.5

Each pair takes ``num_examples`` examples spread evenly over the split
(:func:`spread`: every (len / n)-th, from the first), whatever their length:
the default families' splits are ordered by source file, so the first n
would come from a handful of files (the first 32 T5 test examples come from
4 of its 40). Their prompts / encoder inputs are padded to one width (the
longest of them, see ``harness.encode_examples``), so every method compiles
once per pair.

Budget: the default grid and ``DEFAULT_NUM_EXAMPLES`` are sized so that the
sweep takes about 6-10 minutes on a fresh 2-core CPU machine (compilation,
one program per method and pair, is a large part of it); the auto rows'
tune adds about 2-2.5 minutes per pair (``--no_auto`` skips it; a second
run with the per-user store on reads the tables back, ``auto_store.py``).
See docs/evaluation.md for measured times.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from typing import Callable, Mapping, Sequence

from specdec_jax.decoding import registry
from specdec_jax.eval import (auto_report, auto_rows, drafts, harness, plots,
                              report)

DEFAULT_PAIRS = ("t5_codegen", "gemma_completion")
DEFAULT_NUM_EXAMPLES = 64


def spread(pool: Sequence, n: int | None) -> list:
  """``n`` items of ``pool`` spread evenly over it: indices
  ``i * len(pool) // n`` for i < n, in order (all of it for None or
  n >= len(pool))."""
  pool = list(pool)
  if n is None or n >= len(pool):
    return pool
  if n < 1:
    raise ValueError(f"num_examples must be >= 1 or None, got {n}")
  return [pool[i * len(pool) // n] for i in range(n)]

# method -> {knob: values}: small knob grids that span "close to the
# verifier" to "close to the drafter" for each rule (the ``main_grid`` of
# every method registry row). At temperature 0 Lossy's alpha has no effect
# (App. C.1).
DEFAULT_GRID: dict[str, dict[str, list[float]]] = {
    e.name: {k: list(v) for k, v in e.main_grid.items()}
    for e in registry.ENTRIES if e.main_grid is not None}

# Hierarchical speculative decoding over a family's three sizes: the small
# model drafts T_0 = 3 tokens a batch, the medium one verifies them until it
# holds T_1 = 6, which the large one verifies in one step.
HSD_BUFFERS = (3, 6)
# Tree verification: a full binary tree of depth 3 (14 drafted nodes, 4
# drafter calls, ONE verifier step per block).
TREE_SPEC = "kary:2,3"
# Grid rows that run a method on another draft structure than the chain of
# gamma (eval/drafts.py): row name -> (method, RunConfig draft fields). A
# grid's row names are method names or these.
DRAFT_ROWS: dict[str, tuple[str, dict]] = {
    "hsd": ("spec_decode", {"hierarchy": HSD_BUFFERS}),
    "tree": ("spec_decode", {"tree": TREE_SPEC}),
}
DEFAULT_GRID.update({name: {} for name in DRAFT_ROWS})


def make_configs(grid: Mapping[str, Mapping[str, Sequence[float]]],
                 draft_rows: Mapping[str, tuple[str, Mapping]] | None = None,
                 **sweep) -> list[harness.RunConfig]:
  """The RunConfigs of a grid whose rows are methods or draft rows.

  Args:
    grid: {row: {knob: values}}; a row is a method name or a key of
      ``draft_rows`` (its method on its draft structure).
    draft_rows: {row: (method, {'hierarchy': ...} or {'tree': ...})}
      (default: DRAFT_ROWS).
    **sweep: ``harness.grid``'s temperature, top_p, gamma, max_new_tokens,
      batch_size, seed.

  Returns:
    RunConfigs, deduplicated, in grid order.
  """
  draft_rows = DRAFT_ROWS if draft_rows is None else draft_rows
  configs = []
  for row, knobs in grid.items():
    if row not in draft_rows and row not in registry.REGISTRY:
      raise ValueError(f"unknown grid row {row!r}: use a method name "
                       f"({', '.join(sorted(registry.REGISTRY))}) or a "
                       f"draft row ({', '.join(sorted(draft_rows))})")
    method, draft = draft_rows.get(row, (row, {}))
    configs += harness.grid({method: knobs}, drafts=[dict(draft)], **sweep)
  return list(dict.fromkeys(configs))


def runnable(pair, configs: Sequence[harness.RunConfig]
             ) -> tuple[list[harness.RunConfig], list[str]]:
  """(the configs ``pair`` can run, a message per config it cannot).

  A hierarchy needs as many levels as it has buffers + 1: the default pairs
  offer small, medium, large (small, large in assets without a medium
  model); other pairs their drafter and verifier (``drafts.pair_levels``).
  """
  ok, skipped = [], []
  for cfg in configs:
    why = drafts.unsupported(pair, cfg.hierarchy)
    if why:
      skipped.append(f"skipping {cfg.label}: {why}")
    else:
      ok.append(cfg)
  return ok, skipped


def _default_models():
  from specdec_jax.eval import default_models  # pylint: disable=g-import-not-at-top
  return default_models


@dataclasses.dataclass
class PairOutcome:
  """What the job did for one pair (``run.pad_width``: the padded width;
  ``skipped``: why configs the pair cannot run were left out)."""

  name: str
  num_examples: int
  configs: int
  run: harness.RunStats
  load_s: float
  total_s: float
  plots: list[str]
  skipped: list[str] = dataclasses.field(default_factory=list)
  auto_tune_s: float = 0.0


def run_main_job(out_dir: str, pairs: Sequence[str] | None = None,
                 num_examples: int | None = DEFAULT_NUM_EXAMPLES,
                 grid: Mapping[str, Mapping[str, Sequence[float]]]
                 | None = None,
                 draft_rows: Mapping[str, tuple[str, Mapping]] | None = None,
                 temperature=0.0, top_p=1.0, gamma=5,
                 max_new_tokens: int | None = None, batch_size: int = 1,
                 seed: int = 0, split: str = "test", dtype: str = "float32",
                 assets: str | None = None,
                 repeats: int = 1, progress: bool = True,
                 load_pair: Callable | None = None,
                 load_examples: Callable | None = None,
                 print_fn: Callable[[str], None] = print, auto: bool = True,
                 auto_settings: auto_rows.AutoSettings | None = None,
                 auto_measurer=None) -> dict:
  """Runs the sweep on every pair; writes results, summaries and plots.

  Args:
    out_dir: output directory (created; an existing one is resumed).
    pairs: default pair names (default: all of ``default_models.PAIRS``).
    num_examples: this many examples of the split per pair, spread evenly
      over it (:func:`spread`; None: all).
    grid: {row: {knob: values}}, a row being a method or a draft row
      (default: DEFAULT_GRID, with 'hsd' and 'tree').
    draft_rows: {row: (method, draft fields)} (default: DRAFT_ROWS).
    temperature, top_p, gamma: a value or list each (swept).
    max_new_tokens: None uses each pair's default.
    batch_size: examples per decode call (1 = the paper's latency protocol).
    seed: sampling seed.
    split: dataset split.
    dtype: parameter dtype of the models.
    assets: default-models directory (default: the one in the package;
      ``python -m tools.default_models.build --out`` writes one).
    repeats: time every call this many times, keep the fastest.
    progress: tqdm progress bars.
    load_pair: ``(name, dtype) -> pair`` (default: default_models.load).
    load_examples: ``(name, split) -> examples`` (default:
      default_models.examples).
    print_fn: where the tables go.
    auto: add the 'auto' / 'auto (quality budget)' rows per pair (a short
      tune on the dev split first; ``auto_rows.py``).
    auto_settings, auto_measurer: their settings; injected measurements.

  Returns:
    {'aggregates', 'summary', 'outcomes', 'paths', 'auto'} ('auto': the
    auto rows, ``auto_rows.report_rows``).
  """
  if load_pair is None or load_examples is None:
    dm = _default_models()
    extra = {} if assets is None else dict(assets=assets)
    load_pair = load_pair or (lambda n, d: dm.load(n, dtype=d, **extra))
    load_examples = load_examples or (lambda n, s: dm.examples(n, split=s))
    pairs = tuple(pairs or dm.PAIRS)
  pairs = tuple(pairs or DEFAULT_PAIRS)
  grid = DEFAULT_GRID if grid is None else grid
  all_configs = make_configs(grid, draft_rows, temperature=temperature,
                             top_p=top_p, gamma=gamma,
                             max_new_tokens=max_new_tokens,
                             batch_size=batch_size, seed=seed)
  os.makedirs(out_dir, exist_ok=True)
  results_path = os.path.join(out_dir, "results.jsonl")
  all_aggs, outcomes, plot_paths, autos = [], [], [], []
  settings = auto_settings or auto_rows.AutoSettings()
  draft_rows = DRAFT_ROWS if draft_rows is None else draft_rows
  job_start = time.perf_counter()
  started = time.strftime("%Y-%m-%d %H:%M:%S")
  for name in pairs:
    t0 = time.perf_counter()
    pair = load_pair(name, dtype)
    if pair.name != name:
      raise ValueError(f"load_pair({name!r}) returned a pair named "
                       f"{pair.name!r}; results are keyed by the pair's name")
    pool = list(load_examples(name, split))
    examples = spread(pool, num_examples)
    if not examples:
      raise ValueError(f"{name}: no {split} examples selected (split has "
                       f"{len(pool)})")
    load_s = time.perf_counter() - t0
    configs, skipped = runnable(pair, all_configs)
    for line in skipped:
      print_fn(f"[{name}] {line}")
    tuned = None
    if auto:
      tuned = auto_rows.tune_for_job(
          pair, load_examples, out_dir, settings, grid, draft_rows,
          auto_measurer, print_fn, temperature=temperature, top_p=top_p,
          gamma=gamma, max_new_tokens=max_new_tokens, batch_size=batch_size,
          seed=seed)
      configs = list(dict.fromkeys(configs + list(tuned.configs.values())))
    print_fn(f"[{name}] {len(examples)} {split} examples; {len(configs)} "
             f"configurations")
    stats = harness.run(pair, configs, examples, results_path,
                        repeats=repeats, progress=progress)
    keys = {harness.row_key(name, c, str(ex["id"])) for c in configs
            for ex in examples}
    rows = [r for r in harness.load_rows(results_path) if r["key"] in keys]
    targets = {str(ex["id"]): ex["targets"] for ex in examples}
    aggs = report.aggregate(rows, targets, list(pair.metrics))
    paths = plots.plot_all(aggs, out_dir)
    all_aggs += aggs
    plot_paths += paths
    if tuned is not None:
      autos += auto_rows.report_rows(tuned, aggs)
    outcomes.append(PairOutcome(
        name=name, num_examples=len(examples), configs=len(configs),
        run=stats, load_s=load_s, total_s=time.perf_counter() - t0,
        plots=paths, skipped=skipped,
        auto_tune_s=0.0 if tuned is None else sum(
            s for o, s in tuned.tune_s.items() if o not in tuned.reused)))
    print_fn(f"[{name}] {stats.written} rows measured, {stats.skipped} "
             f"resumed (padded width {stats.pad_width}); {stats.warmups} "
             f"programs compiled in {stats.warmup_s:.0f} s, decoding "
             f"{stats.decode_s:.0f} s, total {outcomes[-1].total_s:.0f} s ({stats.cpu_s:.0f} CPU s "
             f"in the sweep)")
  summaries = report.summarize(all_aggs)
  timings = dict(started=started, total_s=time.perf_counter() - job_start,
                 pairs=[dict(name=o.name, num_examples=o.num_examples,
                             configs=o.configs, load_s=o.load_s,
                             total_s=o.total_s, auto_tune_s=o.auto_tune_s,
                             **dataclasses.asdict(o.run))
                        for o in outcomes])
  runs = _append_timings(os.path.join(out_dir, "timings.jsonl"), timings)
  js, md = report.write_summary(out_dir, all_aggs, summaries,
                                extra=dict(timings=runs, auto=autos))
  print_fn("\n" + report.results_table(all_aggs))
  print_fn(report.summary_table(summaries))
  if autos:
    auto_report.append_to_summary(md, autos)
    print_fn(auto_report.rows_table(autos))
  print_fn(f"wrote {results_path}, {js}, {md}, "
           + ", ".join(plot_paths) + f" in {timings['total_s']:.0f} s")
  return dict(aggregates=all_aggs, summary=summaries, outcomes=outcomes,
              paths=dict(results=results_path, summary_json=js,
                         summary_md=md, plots=plot_paths), auto=autos)


def _append_timings(path: str, timings: dict) -> list[dict]:
  """Appends this invocation's timings; returns those of every invocation.

  A resumed job keeps the timings of the runs that measured its rows.
  """
  runs = harness.load_rows(path) if os.path.exists(path) else []
  with harness.ResultsFile(path) as f:
    row = dict(key=f"run{len(f.rows)}", **timings)
    f.append(row)
  return runs + [row]


def enable_compilation_cache(path: str) -> None:
  """Keeps compiled programs in ``path`` so a rerun does not compile again.

  Sets JAX's persistent compilation cache (process-wide) and, beside it, the
  program store (``program_cache.py``: traced programs and shapes, so a
  rerun does not trace either); call it before the first compilation.
  """
  import jax  # pylint: disable=g-import-not-at-top
  from specdec_jax import program_cache  # pylint: disable=g-import-not-at-top
  os.makedirs(path, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  program_cache.enable(os.path.join(path, "specdec_jax_programs"))


def _floats(text: str) -> list[float]:
  return [float(x) for x in text.split(",") if x]


def main(argv: Sequence[str] | None = None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out_dir", required=True)
  ap.add_argument("--pairs", default=None,
                  help="comma-separated default pair names (default: all)")
  ap.add_argument("--num_examples", type=int, default=DEFAULT_NUM_EXAMPLES)
  ap.add_argument("--methods", default=None,
                  help="comma-separated subset of the default grid (method "
                  "names, 'hsd', 'tree')")
  ap.add_argument("--hsd_buffers", default=None,
                  help="buffers of the 'hsd' row, e.g. 3,6 (default "
                  f"{','.join(map(str, HSD_BUFFERS))})")
  ap.add_argument("--tree", default=None,
                  help=f"tree spec of the 'tree' row (default {TREE_SPEC})")
  ap.add_argument("--grid_json", default=None,
                  help='a JSON grid, e.g. \'{"token_v3": {"alpha": [0.3]}}\'')
  ap.add_argument("--temperature", default="0", help="comma-separated")
  ap.add_argument("--top_p", default="1", help="comma-separated")
  ap.add_argument("--gamma", default="5", help="comma-separated")
  ap.add_argument("--max_new_tokens", type=int, default=None)
  ap.add_argument("--batch_size", type=int, default=1)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--split", default="test")
  ap.add_argument("--dtype", default="float32")
  ap.add_argument("--assets", default=None,
                  help="default-models directory (default: the package's)")
  ap.add_argument("--repeats", type=int, default=1,
                  help="time each call this many times, keep the fastest")
  ap.add_argument("--compilation_cache_dir", default=None,
                  help="persistent JAX compilation cache (default: "
                  "<out_dir>/jax_cache; '' disables it)")
  ap.add_argument("--no_progress", action="store_true")
  auto_rows.add_flags(ap)
  args = ap.parse_args(argv)
  if args.num_examples < 1:
    ap.error(f"--num_examples must be >= 1, got {args.num_examples}")
  grid = json.loads(args.grid_json) if args.grid_json else dict(DEFAULT_GRID)
  if args.methods:
    names = args.methods.split(",")
    unknown = sorted(set(names) - set(grid))
    if unknown:
      sys.exit(f"--methods: {unknown} not in the grid ({sorted(grid)})")
    grid = {m: grid[m] for m in names}
  rows = dict(DRAFT_ROWS)
  if args.hsd_buffers:
    try:
      buffers = tuple(int(t) for t in args.hsd_buffers.split(",") if t)
    except ValueError:
      sys.exit(f"--hsd_buffers: write comma-separated integers such as 3,6; "
               f"got {args.hsd_buffers!r}")
    rows["hsd"] = ("spec_decode", {"hierarchy": buffers})
  if args.tree:
    rows["tree"] = ("spec_decode", {"tree": args.tree})
  cache = (os.path.join(args.out_dir, "jax_cache")
           if args.compilation_cache_dir is None
           else args.compilation_cache_dir)
  if cache:
    enable_compilation_cache(cache)
  run_main_job(
      args.out_dir, pairs=args.pairs.split(",") if args.pairs else None,
      num_examples=args.num_examples, grid=grid, draft_rows=rows,
      temperature=_floats(args.temperature), top_p=_floats(args.top_p),
      gamma=[int(g) for g in _floats(args.gamma)],
      max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
      seed=args.seed, split=args.split, dtype=args.dtype, assets=args.assets,
      repeats=args.repeats,
      progress=not args.no_progress, auto=not args.no_auto,
      auto_settings=auto_rows.settings_of(args))


if __name__ == "__main__":
  main()
