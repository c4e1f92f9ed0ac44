"""Aggregates harness rows and computes the paper's summary numbers.

Per configuration (:func:`aggregate`): corpus-level quality over its
examples (``metrics.compute``), mean latency per example, latency relative to
target-only at the same sampling settings (the x-axis of the paper's Figure
4), tokens/s, acceptance rate, deferral rate and block efficiency.

Per method (:func:`summarize`), as in Table 2 of Faster Cascades
(Narasimhan et al.), over the method's knob sweep at one sampling setting:

1. speedup at matched target quality: ``1 / L*`` where ``L*`` is the smallest
   relative latency at which the method reaches the target-only quality. The
   method's points, sorted by relative latency, form a piecewise-linear curve;
   ``L*`` is where that curve first reaches the target quality -- the first
   point with quality >= target, or, if the point before it is below target,
   the linear interpolation between the two. Interpolation is achievable in
   practice: decoding a random fraction of the requests with each of the two
   settings attains any mix of their latencies and (for per-example metrics
   exactly, for corpus metrics closely) of their qualities. The nearest
   measured point (no interpolation) is reported beside it. Never
   extrapolated: a method that never reaches the target quality has None.
2. best quality within the target's latency: the best quality among the
   method's measured points with relative latency <= 1.

Example (target quality 20; points (rel. latency, quality)):

    (0.3, 10), (0.5, 30), (0.7, 35)  ->  L* = 0.3 + 0.5 * 0.2 = 0.4,
    speedup 2.5x (interpolated), 2.0x (nearest point 0.5); best quality
    within latency 1 = 35.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
from typing import Callable, Mapping, Sequence

from specdec_jax.eval.harness import RunConfig

MetricFn = Callable[[Sequence[str], Sequence, Sequence[str]], dict]

BASELINE = "target_only"


def _default_metric_fn() -> MetricFn:
  from specdec_jax.eval import metrics  # pylint: disable=g-import-not-at-top
  return metrics.compute


@dataclasses.dataclass(frozen=True)
class Aggregate:
  """Aggregates of one configuration over its examples.

  Attributes:
    pair: the model pair's name.
    config: the RunConfig.
    num_examples: examples measured.
    quality: {metric name: corpus score (0-100)}.
    metric: the primary metric (the first of the pair's metrics).
    mean_latency_s: mean wall-clock seconds per example.
    relative_latency: this config's total latency / target-only's total
      latency over the same examples at the same sampling settings (None
      without a target-only run).
    tokens_per_s: generated tokens / decode seconds.
    mean_tokens: mean generated tokens per example.
    acceptance_rate: accepted / drafted drafts (None without drafts); it
      depends on gamma (vLLM's "draft acceptance rate").
    alpha: accepted / (accepted + rejections): the fraction of accept tests
      passed, the per-token acceptance rate alpha of Leviathan et al. (None
      without drafts, or for rows recorded before rejections were).
    deferral_rate: deferral mass per generated token.
    block_efficiency: generated tokens per verifier call (None without
      verifier calls).
  """

  pair: str
  config: RunConfig
  num_examples: int
  quality: dict
  metric: str
  mean_latency_s: float
  relative_latency: float | None
  tokens_per_s: float
  mean_tokens: float
  acceptance_rate: float | None
  deferral_rate: float | None
  block_efficiency: float | None
  alpha: float | None = None

  @property
  def score(self) -> float:
    """The primary metric's value."""
    return self.quality[self.metric]

  @property
  def method(self) -> str:
    return self.config.method

  @property
  def curve(self) -> tuple[str, int, str]:
    """(method, gamma, draft structure): the knob curve this point is on."""
    return self.config.method, self.config.gamma, self.config.draft

  @property
  def setting(self) -> tuple:
    """What target-only must share to be this config's baseline."""
    return setting_of(self.pair, self.config)

  def to_json(self) -> dict:
    d = dataclasses.asdict(self)
    d["config"] = self.config.to_json()
    d["config_key"] = self.config.key
    d["score"] = self.score
    return d


SETTING_FIELDS = ("pair", "temperature", "top_p", "max_new_tokens",
                  "batch_size", "seed")


def setting_of(pair: str, cfg: RunConfig) -> tuple:
  """(pair, temperature, top_p, max_new_tokens, batch_size, seed)."""
  return (pair, cfg.temperature, cfg.top_p, cfg.max_new_tokens,
          cfg.batch_size, cfg.seed)


def _ratio(num: float, den: float) -> float | None:
  return num / den if den else None


def _alpha(rows: Sequence[Mapping]) -> float | None:
  """accepted / (accepted + rejections) over rows that record both."""
  if not rows or any("rejected" not in r for r in rows):
    return None
  accepted = sum(r["accepted"] for r in rows)
  return _ratio(accepted, accepted + sum(r["rejected"] for r in rows))


def aggregate(rows: Sequence[Mapping], targets: Mapping[str, object],
              metrics: Sequence[str], *,
              metric_fn: MetricFn | None = None) -> list[Aggregate]:
  """Aggregates harness rows per (pair, configuration).

  Args:
    rows: rows of a results file (``harness.load_rows``).
    targets: example id -> reference string (or list of references); every
      row's example must be there.
    metrics: metric names (``metrics.METRICS``); the first is the primary
      quality measure.
    metric_fn: ``(names, targets, predictions) -> {name: score}``; default
      ``specdec_jax.eval.metrics.compute``.

  Returns:
    Aggregates, in the order configurations first appear in ``rows``.
  """
  if not metrics:
    raise ValueError("pass at least one metric name (the first is primary)")
  metric_fn = metric_fn or _default_metric_fn()
  groups = collections.OrderedDict()
  for row in rows:
    groups.setdefault((row["pair"], row["config_key"]), []).append(row)
  missing = sorted({r["example_id"] for r in rows} - set(targets))
  if missing:
    raise ValueError(f"no targets for examples {missing[:5]} "
                     f"({len(missing)} in all); pass the examples the rows "
                     f"were measured on")
  cfgs = {k: RunConfig.from_json(g[0]["config"]) for k, g in groups.items()}
  # Target-only latency per (setting, example) for the relative latency.
  base = {}
  for (pair, ckey), g in groups.items():
    if cfgs[(pair, ckey)].method == BASELINE:
      base[setting_of(pair, cfgs[(pair, ckey)])] = {
          r["example_id"]: r["latency_s"] for r in g}
  out = []
  for (pair, ckey), g in groups.items():
    cfg = cfgs[(pair, ckey)]
    preds = [r["prediction"] for r in g]
    refs = [targets[r["example_id"]] for r in g]
    quality = {k: float(v) for k, v in metric_fn(list(metrics), refs,
                                                  preds).items()}
    latency = sum(r["latency_s"] for r in g)
    tokens = sum(r["num_tokens"] for r in g)
    drafted = sum(r["drafted"] for r in g)
    calls = sum(r["verifier_calls"] for r in g)
    rel = None
    b = base.get(setting_of(pair, cfg))
    if b is not None:
      shared = [r for r in g if r["example_id"] in b]
      rel = _ratio(sum(r["latency_s"] for r in shared),
                   sum(b[r["example_id"]] for r in shared))
    out.append(Aggregate(
        pair=pair, config=cfg, num_examples=len(g), quality=quality,
        metric=metrics[0], mean_latency_s=latency / len(g),
        relative_latency=rel, tokens_per_s=_ratio(tokens, latency) or 0.0,
        mean_tokens=tokens / len(g),
        acceptance_rate=_ratio(sum(r["accepted"] for r in g), drafted),
        deferral_rate=_ratio(sum(r["deferrals"] for r in g), tokens),
        block_efficiency=_ratio(tokens, calls), alpha=_alpha(g)))
  return out


# ---------------------------------------------------------------- summary


def matched_quality_latency(points: Sequence[tuple[float, float]],
                            target_quality: float,
                            interpolate: bool = True) -> float | None:
  """Smallest latency at which a quality-latency curve reaches a quality.

  Args:
    points: (latency, quality) of a method's knob settings.
    target_quality: the quality to reach (target-only's).
    interpolate: interpolate linearly between the last point below and the
      first point at/above the target (latency-sorted); else the first
      point at/above it.

  Returns:
    The latency, or None if no point reaches ``target_quality``.
  """
  pts = sorted((float(l), float(q)) for l, q in points
               if l is not None and math.isfinite(l))
  for i, (lat, q) in enumerate(pts):
    if q >= target_quality:
      if not interpolate or i == 0:
        return lat
      l0, q0 = pts[i - 1]  # q0 < target_quality <= q
      return l0 + (target_quality - q0) / (q - q0) * (lat - l0)
  return None


def best_quality_within(points: Sequence[tuple[float, float]],
                        max_latency: float = 1.0
                        ) -> tuple[float, float] | None:
  """(best quality, its latency) among points with latency <= max_latency.

  Ties in quality go to the smaller latency. None if no point qualifies.
  """
  ok = [(float(q), -float(l)) for l, q in points
        if l is not None and l <= max_latency]
  if not ok:
    return None
  q, neg_l = max(ok)
  return q, -neg_l


@dataclasses.dataclass(frozen=True)
class MethodSummary:
  """The paper's two numbers for one method curve at one setting.

  Attributes:
    pair, temperature, top_p: the setting (with max_new_tokens, batch_size,
      seed in ``setting``).
    method, gamma: the curve (gamma 0 for methods without drafts and for
      hierarchies / trees).
    metric: the quality metric.
    target_quality: target-only quality at this setting.
    num_points: knob settings measured.
    speedup_matched: 1 / interpolated relative latency at target quality.
    speedup_matched_point: 1 / relative latency of the first measured point
      at target quality.
    matched_knobs: knobs of that point.
    best_quality: best quality with relative latency <= 1.
    best_quality_latency: its relative latency.
    best_knobs: its knobs.
    draft: the draft structure ('' for the chain, 'hierarchy=3,6',
      'tree=kary:2,3'; ``RunConfig.draft``).
    label: readable name ('SpecCascade [TokenV3]', 'HSD
      small>medium>large (3,6)', 'SpecDecode tree 2x3').
  """

  pair: str
  setting: tuple
  temperature: float
  top_p: float
  method: str
  gamma: int
  metric: str
  target_quality: float
  num_points: int
  speedup_matched: float | None
  speedup_matched_point: float | None
  matched_knobs: str | None
  best_quality: float | None
  best_quality_latency: float | None
  best_knobs: str | None
  draft: str = ""
  label: str = ""

  def to_json(self) -> dict:
    d = dataclasses.asdict(self)
    d["setting"] = dict(zip(SETTING_FIELDS, self.setting))
    return d


BASELINE_CURVE = (BASELINE, 0, "")


def curves(aggs: Sequence[Aggregate]) -> dict:
  """{setting: {(method, gamma, draft): [Aggregate, ...] sorted by latency}}.

  ``draft`` is '' for the chain of gamma, else the hierarchy / tree
  (``RunConfig.draft``), so SpecDecode on a chain, a hierarchy and a tree
  are three curves.
  """
  out = collections.OrderedDict()
  for a in aggs:
    c = out.setdefault(a.setting, collections.OrderedDict())
    c.setdefault(a.curve, []).append(a)
  for c in out.values():
    for k in c:
      c[k].sort(key=lambda a: (a.relative_latency is None,
                               a.relative_latency or 0.0))
  return out


def summarize(aggs: Sequence[Aggregate]) -> list[MethodSummary]:
  """The paper's two summary numbers for every method curve and setting.

  Settings without a target-only aggregate are skipped (nothing to match).
  """
  out = []
  for setting, by_curve in curves(aggs).items():
    base = by_curve.get(BASELINE_CURVE)
    if not base:
      continue
    tq = base[0].score
    for (method, gamma, draft), pts in by_curve.items():
      xy = [(a.relative_latency, a.score) for a in pts]
      lat = matched_quality_latency(xy, tq, interpolate=True)
      lat_pt = matched_quality_latency(xy, tq, interpolate=False)
      knobs = next((a.config.knob_str for a in pts if lat_pt is not None
                    and a.relative_latency == lat_pt and a.score >= tq), None)
      best = best_quality_within(xy, 1.0)
      best_knobs = None
      if best is not None:
        best_knobs = next(a.config.knob_str for a in pts
                          if a.score == best[0]
                          and a.relative_latency == best[1])
      inv = lambda l: (1.0 / l) if l else None
      out.append(MethodSummary(
          pair=setting[0], setting=setting, temperature=setting[1],
          top_p=setting[2], method=method, gamma=gamma, metric=pts[0].metric,
          target_quality=tq, num_points=len(pts),
          speedup_matched=inv(lat), speedup_matched_point=inv(lat_pt),
          matched_knobs=knobs,
          best_quality=None if best is None else best[0],
          best_quality_latency=None if best is None else best[1],
          best_knobs=best_knobs, draft=draft, label=pts[0].config.label))
  return out


# ---------------------------------------------------------------- tables


def _f(x, fmt="{:.2f}", none="-") -> str:
  if x is None or (isinstance(x, float) and math.isnan(x)):
    return none
  return fmt.format(x)


def setting_title(setting: tuple) -> str:
  pair, t, p, max_new, bs, seed = setting
  samp = "greedy" if t == 0 else f"T={t:g}" + (f", top-p={p:g}" if p < 1
                                                else "")
  new = "" if max_new is None else f", max_new_tokens={max_new}"
  return f"{pair}: {samp}{new}, batch {bs}, seed {seed}"


def method_cell(method: str, draft: str, label: str) -> str:
  """The method column of the tables: the registry name for a chain, the
  readable label ('HSD small>medium>large (3,6)') for a hierarchy or tree."""
  return label if draft else method


def results_table(aggs: Sequence[Aggregate]) -> str:
  """Markdown: one table per setting, one row per configuration."""
  lines = []
  for setting, by_curve in curves(aggs).items():
    metric = next(iter(by_curve.values()))[0].metric
    lines += [f"### {setting_title(setting)}", "",
              f"| method | gamma | knobs | {metric} | rel. latency | "
              f"latency ms | tokens/s | accept rate | alpha | "
              f"deferral rate | tokens/call | n |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (method, gamma, draft), pts in by_curve.items():
      name = method_cell(method, draft, pts[0].config.label)
      for a in pts:
        lines.append(
            f"| {name} | {gamma or '-'} | {a.config.knob_str or '-'} | "
            f"{a.score:.2f} | {_f(a.relative_latency)} | "
            f"{1e3 * a.mean_latency_s:.1f} | {a.tokens_per_s:.1f} | "
            f"{_f(a.acceptance_rate)} | {_f(a.alpha)} | "
            f"{_f(a.deferral_rate)} | "
            f"{_f(a.block_efficiency)} | {a.num_examples} |")
    lines.append("")
  return "\n".join(lines)


def summary_table(summaries: Sequence[MethodSummary]) -> str:
  """Markdown: the two summary numbers per method (Table 2 style)."""
  lines, last = [], None
  for s in summaries:
    if s.setting != last:
      last = s.setting
      lines += ([""] if lines else []) + [
          f"### {setting_title(s.setting)}", "",
          f"Target-only {s.metric}: {s.target_quality:.2f}", "",
          "| method | gamma | points | speedup @ matched quality (interp.) "
          f"| speedup (measured point) | knobs | best {s.metric} @ rel. "
          "latency <= 1 | its rel. latency | knobs |",
          "|---|---|---|---|---|---|---|---|---|"]
    lines.append(
        f"| {method_cell(s.method, s.draft, s.label)} | {s.gamma or '-'} | "
        f"{s.num_points} | "
        f"{_f(s.speedup_matched, '{:.2f}x', 'not reached')} | "
        f"{_f(s.speedup_matched_point, '{:.2f}x', 'not reached')} | "
        f"{s.matched_knobs or '-'} | {_f(s.best_quality)} | "
        f"{_f(s.best_quality_latency)} | {s.best_knobs or '-'} |")
  return "\n".join(lines) + "\n"


def write_summary(out_dir: str, aggs: Sequence[Aggregate],
                  summaries: Sequence[MethodSummary],
                  extra: Mapping | None = None) -> tuple[str, str]:
  """Writes summary.json and summary.md into ``out_dir``; returns paths."""
  os.makedirs(out_dir, exist_ok=True)
  js = os.path.join(out_dir, "summary.json")
  md = os.path.join(out_dir, "summary.md")
  payload = dict(summary=[s.to_json() for s in summaries],
                 aggregates=[a.to_json() for a in aggs], **(extra or {}))
  with open(js, "w", encoding="utf-8") as f:
    json.dump(payload, f, indent=1, allow_nan=True)
  text = ["# Summary", "",
          "Speedup at matched quality = target-only latency / the smallest "
          "latency at which the method reaches target-only quality "
          "(interpolated linearly along its latency-sorted knob curve; the "
          "measured point beside it). Best quality = best measured quality "
          "at relative latency <= 1.", "", summary_table(summaries), "",
          "## All configurations", "", results_table(aggs)]
  with open(md, "w", encoding="utf-8") as f:
    f.write("\n".join(text))
  return js, md
