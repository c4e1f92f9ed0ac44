"""The main job's ``auto`` rows: tune each pair, run what auto chose.

Before a pair's sweep, ``planners.tune`` measures a small candidate set on a
few examples of the pair's VALIDATION split (never the test split the sweep
measures; a pair without one: the first examples of its train split, said
so) at the job's batch size, twice with one measurer (its compiled runners
are shared):

    auto                   objective 'latency': the fastest LOSSLESS choice
                           (target-only, SpecDecode on a chain / tree / the
                           pair's 3-level stack)
    auto (quality budget)  objective 'quality', latency_budget (default 0.8:
                           at most 80% of target-only's seconds per token):
                           the best quality within it, cascades included

Each choice (a ``planners.auto.Candidate``) becomes a ``harness.RunConfig``
(:func:`to_run_config`) added to the pair's configs -- no extra decode when
the grid has it already -- so the rows report what the SWEEP measured on
the test split: latency relative to target-only and quality. Each pair's
tables are written to ``auto_<pair>_<objective>.gin`` in the job's
directory (the AutoTable gin format, ``specdec_jax decode
--gin.run.tune_file=`` reads them) and a resumed job reuses them (no
re-tune). The CLI also keeps them in the per-user store
(``auto_store.py``), keyed by the models' parameters, the calibration
examples, every setting and the machine: a second invocation with a fresh
output directory reuses them too ("reused the tuned table from the user
cache"); ``--retune`` (``AutoSettings.reuse = False``) tunes again.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Callable, Mapping, Sequence

from specdec_jax import decoding, program_cache
from specdec_jax.decoding import planners
from specdec_jax.decoding.planners import auto as auto_lib
from specdec_jax.decoding.planners import tune_store
from specdec_jax.decoding.planners.tune_measure import DecodeMeasurer
from specdec_jax.eval import auto_store, drafts, harness

LABELS = {"latency": "auto", "quality": "auto (quality budget)"}


@dataclasses.dataclass(frozen=True)
class AutoSettings:
  """How the main job tunes its auto rows (small, to keep the job's budget).

  Attributes:
    latency_budget: the quality row's most seconds per token relative to
      target-only (0.8: at least 1.25x its tokens/s).
    num_examples: calibration examples of the dev split.
    split: the split they come from ('train' when a pair has no such split).
    gammas: chain gammas (priced by the CostModel; the ``prune`` best
      predicted are decoded).
    trees: (k, depth) full k-ary trees.
    cascade: the quality row's lossy method (on a chain of the job's gamma;
      its alphas: the grid's, else ``alphas``).
    alphas: its alphas when the job's grid has none.
    new_tokens, repeats, prune, price: ``planners.tune``'s.
    reuse: read tables back (a resumed job's files, the user cache);
      False tunes again (``--retune``) and replaces them.
  """

  latency_budget: float = 0.8
  num_examples: int = 4
  split: str = "validation"
  gammas: tuple[int, ...] = (2, 3, 4, 5, 6)
  trees: tuple[tuple[int, int], ...] = ((2, 2), (2, 3))
  cascade: str = "token_v3"
  alphas: tuple[float, ...] = (0.2, 0.5, 0.8)
  new_tokens: int = 16
  repeats: int = 3
  prune: int = 3
  price: bool = True
  reuse: bool = True

  def __post_init__(self):
    auto_lib.check_objective("quality", self.latency_budget, None)
    if self.num_examples < 1:
      raise ValueError(f"auto num_examples must be >= 1, got "
                       f"{self.num_examples}")


def tree_spec(tree: decoding.Tree) -> str:
  """The harness tree spec of a ``decoding.Tree`` ('kary:2,3', 'chain:4',
  + '/iid' or '/top_k'); ValueError for other shapes."""
  topo = tree.topology
  k, d = sum(p == -1 for p in topo.parents), topo.max_depth
  if decoding.Topology.kary(k, d).parents == tuple(topo.parents):
    spec = f"kary:{k},{d}" if k > 1 else f"chain:{d}"
  else:
    raise ValueError(f"the harness runs k-ary and chain trees only, got a "
                     f"{topo.num_nodes}-node tree of depth {d}; tune with "
                     f"(k, depth) trees")
  return drafts.canonical_tree(
      spec if tree.proposal == "without_replacement"
      else f"{spec}/{tree.proposal}")


def to_run_config(cand: auto_lib.Candidate, num_levels: int, **fields
                  ) -> harness.RunConfig:
  """The sweep config of a tuned candidate.

  Args:
    cand: what tune chose (levels index the pair's ``drafts.pair_levels``).
    num_levels: levels the pair has (2, or 3 with a medium model).
    **fields: RunConfig's temperature, top_p, max_new_tokens, batch_size,
      seed.

  Returns:
    target-only -> ``RunConfig('target_only')``; a chain -> its gamma; a
    k-ary tree -> ``tree='kary:k,d'``; a stack -> ``hierarchy=buffers``; a
    cascade -> its method and knobs on its chain.
  """
  if cand.method == "target_only":
    return harness.RunConfig("target_only", **fields)
  s, top = cand.structure, num_levels - 1
  if isinstance(s, decoding.Stack):
    if tuple(cand.levels) != tuple(range(num_levels)):
      raise ValueError(f"{cand.label}: the harness runs a hierarchy over "
                       f"all {num_levels} levels of the pair, got levels "
                       f"{list(cand.levels)}")
    return harness.RunConfig(cand.method, cand.knobs,
                             hierarchy=tuple(s.buffers), **fields)
  if tuple(cand.levels) != (0, top):
    raise ValueError(f"{cand.label}: the harness drafts with the pair's "
                     f"drafter (level 0) for its verifier (level {top}), "
                     f"got levels {list(cand.levels)}")
  if isinstance(s, decoding.Tree):
    return harness.RunConfig(cand.method, cand.knobs, tree=tree_spec(s),
                             **fields)
  return harness.RunConfig(cand.method, cand.knobs, gamma=s.gamma, **fields)


def describe(cfg: harness.RunConfig) -> str:
  """'SpecDecode gamma=4', 'SpecCascade [TokenV3] gamma=5 alpha=0.5'."""
  parts = [cfg.label] + ([f"gamma={cfg.gamma}"] if cfg.gamma else [])
  return " ".join(parts + ([cfg.knob_str] if cfg.knobs else []))


@dataclasses.dataclass(frozen=True)
class PairTune:
  """A pair's auto tables and the configs they resolve to.

  Attributes:
    pair: the pair's name.
    tables: {objective: AutoTable}.
    configs: {row label: RunConfig} ('auto', 'auto (quality budget)').
    tune_s: {objective: seconds tuning took (when it was tuned)}.
    reused: objectives read back (from out_dir: a resumed job; or from
      the user cache).
    split: the split the calibration examples came from.
    paths: {objective: the table's gin file}.
    from_store: the reused objectives read from the user cache.
  """

  pair: str
  tables: Mapping[str, auto_lib.AutoTable]
  configs: Mapping[str, harness.RunConfig]
  tune_s: Mapping[str, float]
  reused: tuple[str, ...]
  split: str
  paths: Mapping[str, str]
  from_store: tuple[str, ...] = ()


def table_path(out_dir: str, pair: str, objective: str) -> str:
  return os.path.join(out_dir, f"auto_{pair}_{objective}.gin")


def calibration_examples(load_examples: Callable, name: str,
                         settings: AutoSettings, say: Callable[[str], None]
                         ) -> tuple[list, str]:
  """(examples, split): ``num_examples`` spread over the dev split, or the
  first ones of the train split when the pair has no dev split."""
  n = settings.num_examples
  try:
    pool = list(load_examples(name, settings.split))
  except (ValueError, KeyError, FileNotFoundError):
    pool = []
  if pool:
    pick = [pool[i * len(pool) // n] for i in range(min(n, len(pool)))]
    return pick, settings.split
  say(f"[{name}] auto: no {settings.split} split; tuning on the first {n} "
      f"train examples")
  pool = list(load_examples(name, "train"))[:n]
  if not pool:
    raise ValueError(f"{name}: no {settings.split} or train examples to tune "
                     f"the auto rows on; pass auto=False (--no_auto)")
  return pool, "train"


def _encoded(pair, examples) -> tuple[list, bool]:
  """(token rows, encoder-decoder?) of the calibration examples."""
  encoded, _ = harness.encode_examples(pair, examples)
  enc = "inputs" in encoded[0]
  return [e["inputs" if enc else "prompts"] for e in encoded], enc


def _measurer(pair, rows, enc: bool, settings: AutoSettings,
              temperature: float, seed: int) -> DecodeMeasurer:
  """One DecodeMeasurer for both objectives (compiled runners shared)."""
  levels = drafts.pair_levels(pair)
  return DecodeMeasurer([m for m, _ in levels], [p for _, p in levels], rows,
                        enc, settings.new_tokens,
                        decoding.Temperature(temperature), settings.repeats,
                        seed=seed)


def _tune(name: str, objective: str, levels: int, measurer,
          settings: AutoSettings, batch: int, temperature: float, stack,
          alphas: tuple, gamma: int, seed: int, say) -> auto_lib.AutoTable:
  """``planners.tune`` of one objective at the job's batch size."""
  return planners.tune(
      [None] * levels, [None] * levels, batch_sizes=(batch,),
      objective=objective, temperature=temperature,
      latency_budget=(settings.latency_budget if objective == "quality"
                      else None),
      gammas=settings.gammas, trees=settings.trees,
      stacks=(tuple(stack),) if stack else (),
      cascades=((settings.cascade, alphas),), cascade_gamma=gamma,
      new_tokens=settings.new_tokens, repeats=settings.repeats,
      prune=settings.prune, price=settings.price, measurer=measurer,
      seed=seed, progress=lambda s: say(f"[{name}] auto ({objective}): {s}"))


def tune_pair(pair, load_examples: Callable, out_dir: str,
              settings: AutoSettings, *, temperature: float, top_p: float,
              gamma: int, max_new_tokens: int | None, batch_size: int,
              seed: int, stack: Sequence[int] | None,
              alphas: Sequence[float] | None, measurer=None,
              store: bool | None = None,
              say: Callable[[str], None] = print) -> PairTune:
  """Tunes (or reads back) both auto tables of ``pair``; see the module doc.

  Args:
    pair: the pair (``drafts.pair_levels`` gives its models).
    load_examples: ``(name, split) -> examples``.
    out_dir: where the tables are written / read back.
    settings: candidate set and calibration size.
    temperature, top_p, gamma, max_new_tokens, batch_size, seed: the
      job's (its first value where it sweeps several); gamma is the
      cascade's chain.
    stack: the 3-level hierarchy's buffers (the job's 'hsd' row), or None.
    alphas: the cascade's alphas (None: ``settings.alphas``).
    measurer: ``measure(candidates, batch)`` (tests inject one); default: a
      DecodeMeasurer on the calibration examples.
    store: read tables back from / keep them in the per-user store
      (``decoding/planners/tune_store.py``) when ``program_cache`` is on.
      None: with the default measurer only; True: with an injected one too.
  """
  levels = len(drafts.pair_levels(pair))
  paths = {o: table_path(out_dir, pair.name, o) for o in LABELS}
  tables, tune_s, reused = {}, {}, []
  for objective, path in paths.items():
    got = settings.reuse and auto_store.resumed(path, batch_size,
                                                float(temperature))
    if got:
      tables[objective], tune_s[objective] = got
      reused.append(objective)
  split, alphas = settings.split, tuple(alphas or settings.alphas)
  todo = [o for o in LABELS if o not in tables]
  use_store = program_cache.directory() is not None and (
      measurer is None if store is None else bool(store))
  keys, found = {}, {}
  if todo and (measurer is None or use_store):
    examples, split = calibration_examples(load_examples, pair.name,
                                           settings, say)
    rows, enc = _encoded(pair, examples)
  if todo and use_store:
    job = dict(temperature=float(temperature), top_p=float(top_p),
               gamma=int(gamma), max_new_tokens=max_new_tokens,
               batch_size=int(batch_size), seed=int(seed),
               stack=list(stack) if stack else None, alphas=list(alphas))
    keys, found = auto_store.read_back(pair, settings, rows, split, todo,
                                       job, LABELS, paths, say)
    for objective, got in found.items():
      tables[objective], tune_s[objective] = got.table, got.tune_s
    reused += list(found)
    todo = [o for o in todo if o not in found]
  if todo and measurer is None:
    measurer = _measurer(pair, rows, enc, settings, float(temperature), seed)
  for objective in todo:
    t0 = time.perf_counter()
    tables[objective] = _tune(pair.name, objective, levels, measurer,
                              settings, batch_size, float(temperature),
                              stack, alphas, int(gamma), seed, say)
    tune_s[objective] = time.perf_counter() - t0
    tables[objective].save(paths[objective], note=(
        f"main job {LABELS[objective]!r} row of {pair.name}: tuned in "
        f"{tune_s[objective]:.1f} s on {settings.num_examples} {split} "
        f"examples (a resumed job reuses this file)"))
    if objective in keys:
      tune_store.keep(keys[objective], tables[objective], tune_s[objective],
                      where=os.path.abspath(out_dir))
  fields = dict(temperature=temperature, top_p=top_p,
                max_new_tokens=max_new_tokens, batch_size=batch_size,
                seed=seed)
  configs = {LABELS[o]: to_run_config(
      tables[o].row_for(batch_size).choice.candidate, levels, **fields)
             for o in LABELS}
  return PairTune(pair.name, tables, configs, tune_s, tuple(reused), split,
                  paths, tuple(found))


def _first(x):
  return x[0] if isinstance(x, (list, tuple)) else x


def tune_for_job(pair, load_examples: Callable, out_dir: str,
                 settings: AutoSettings, grid: Mapping, draft_rows: Mapping,
                 measurer, say: Callable[[str], None], **sweep) -> PairTune:
  """The pair's auto tables (tuned, or read back from out_dir) at the
  job's first temperature / top-p / gamma; the stack is the 'hsd' row's
  buffers on a 3-level pair, the cascade alphas the grid's."""
  hsd = draft_rows.get("hsd", (None, {}))[1].get("hierarchy")
  stack = hsd if hsd and not drafts.unsupported(pair, tuple(hsd)) else None
  alphas = dict(grid).get(settings.cascade, {}).get("alpha")
  t0 = time.perf_counter()
  tuned = tune_pair(
      pair, load_examples, out_dir, settings,
      **{k: _first(v) for k, v in sweep.items()}, stack=stack,
      alphas=alphas, measurer=measurer, say=say)
  for label, cfg in tuned.configs.items():
    say(f"[{pair.name}] {label} -> {describe(cfg)}")
  how = ("reused" if len(tuned.reused) == len(LABELS)
         else f"tuned on {tuned.split} examples")
  say(f"[{pair.name}] auto tables {how} in {time.perf_counter() - t0:.1f} s")
  return tuned


def add_flags(ap) -> None:
  """The main job's auto flags (argparse)."""
  ap.add_argument("--no_auto", action="store_true",
                  help="leave out the 'auto' and 'auto (quality budget)' "
                  "rows (saves each pair's short tune on the dev split; "
                  "docs/evaluation.md gives its cost)")
  ap.add_argument("--auto_latency_budget", type=float,
                  default=AutoSettings.latency_budget,
                  help="the 'auto (quality budget)' row's most seconds per "
                  "token relative to target-only")
  ap.add_argument("--retune", action="store_true",
                  help="tune the auto rows again instead of reusing tables "
                  "of a resumed job or of the user cache")


def settings_of(args) -> AutoSettings:
  """AutoSettings of :func:`add_flags`' parsed flags."""
  return AutoSettings(latency_budget=args.auto_latency_budget,
                      reuse=not args.retune)


def report_rows(tuned: PairTune, aggs: Sequence) -> list[dict]:
  """The pair's two auto rows, from the sweep's aggregates (test split).

  Args:
    tuned: :func:`tune_pair`'s result.
    aggs: the pair's ``report.Aggregate`` values (the auto configs among
      them).

  Returns:
    [{'pair', 'label', 'objective', 'resolved', 'config_key',
    'relative_latency', 'speedup', 'quality', 'metric', 'tune_ratio',
    'tune_quality', 'tune_s', 'reused', 'table'}] in LABELS order.
  """
  by_config = {a.config: a for a in aggs if a.pair == tuned.pair}
  out = []
  for objective, label in LABELS.items():
    cfg = tuned.configs[label]
    agg = by_config.get(cfg)
    table = tuned.tables[objective]
    choice = table.row_for(cfg.batch_size).choice
    rel = None if agg is None else agg.relative_latency
    out.append(dict(
        pair=tuned.pair, label=label, objective=objective,
        latency_budget=table.latency_budget, resolved=describe(cfg),
        choice=choice.candidate.label, config_key=cfg.key,
        relative_latency=rel, speedup=None if not rel else 1.0 / rel,
        quality=None if agg is None else agg.score,
        metric=None if agg is None else agg.metric,
        tune_ratio=float(choice.ratio), tune_quality=choice.quality,
        tune_s=float(tuned.tune_s.get(objective, 0.0)),
        reused=objective in tuned.reused, table=tuned.paths[objective]))
  return out
