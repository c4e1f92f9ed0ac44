"""Quality vs relative latency plots (Faster Cascades, Figure 4 style).

One curve per method and draft structure across its knob sweep (points
sorted by relative latency; SpecDecode on a chain, on a hierarchy and on a
tree are three curves, the last two named by ``RunConfig.label``: 'HSD
small>medium>large (3,6)', 'SpecDecode tree 2x3'), target-only and
drafter-only as single markers, and a dashed horizontal line at the
target-only quality. Uses matplotlib's Agg backend
(no display needed).
"""

from __future__ import annotations

import os
import re
from typing import Sequence

from specdec_jax.decoding import registry
from specdec_jax.eval import report

# Paper-style names for the legend (from the method registry).
LABELS = {e.name: e.label for e in registry.ENTRIES}

POINT_METHODS = ("target_only", "drafter_only")
TARGET_LINE = "target quality"


def label(method: str, gamma: int, show_gamma: bool) -> str:
  name = LABELS.get(method, method)
  return f"{name} (gamma={gamma})" if show_gamma and gamma else name


def plot_file_name(setting: tuple, many: bool) -> str:
  """quality_vs_latency_<pair>.png (+ _T.._p.. when a pair has many)."""
  pair, t, p, max_new, bs, seed = setting
  name = f"quality_vs_latency_{pair}"
  if many:
    name += f"_T{t:g}_p{p:g}" + ("" if max_new is None else f"_n{max_new}")
    name += ("" if bs == 1 else f"_bs{bs}") + ("" if seed == 0 else
                                              f"_s{seed}")
  return re.sub(r"[^A-Za-z0-9_.=-]", "_", name) + ".png"


def plot_quality_vs_latency(aggs: Sequence[report.Aggregate], path: str,
                            title: str | None = None
                            ) -> dict[str, tuple[list, list]]:
  """Plots one setting's aggregates; returns the series actually drawn.

  Args:
    aggs: aggregates of ONE setting (same pair and sampling settings), with
      relative latencies (a target-only aggregate among them).
    path: the PNG to write.
    title: figure title (default: the setting).

  Returns:
    {legend label: (x values, y values)} read back from the drawn lines,
    including the dashed target-quality line under ``TARGET_LINE``.
  """
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top

  by_setting = report.curves(aggs)
  if len(by_setting) != 1:
    raise ValueError(f"plot one setting at a time; got {len(by_setting)} "
                     f"(pairs / sampling settings): {list(by_setting)}")
  setting, by_curve = next(iter(by_setting.items()))
  if report.BASELINE_CURVE not in by_curve:
    raise ValueError(f"no target-only aggregate for {setting}: relative "
                     f"latency needs it")
  gammas = {}  # gammas of each method's chain curves
  for method, gamma, draft in by_curve:
    if not draft:
      gammas.setdefault(method, set()).add(gamma)
  fig, ax = plt.subplots(figsize=(9, 5.5))
  colors = plt.get_cmap("tab20").colors
  markers = "o^vsDP<>Xph*"
  metric, k = None, 0
  for (method, gamma, draft), pts in by_curve.items():
    pts = [a for a in pts if a.relative_latency is not None]
    if not pts:
      continue
    metric = pts[0].metric
    xs = [a.relative_latency for a in pts]
    ys = [a.score for a in pts]
    name = (pts[0].config.label if draft
            else label(method, gamma, len(gammas[method]) > 1))
    if method in POINT_METHODS:
      ax.plot(xs, ys, linestyle="none", marker="*" if method == "target_only"
              else "s", markersize=13, color="black" if method ==
              "target_only" else "gray", label=name, zorder=5)
    else:
      ax.plot(xs, ys, marker=markers[k % len(markers)], markersize=5,
              linewidth=1.5, color=colors[(2 * k) % 20 + (k // 10) % 2],
              label=name)
      k += 1
  target_q = by_curve[report.BASELINE_CURVE][0].score
  ax.axhline(target_q, linestyle="--", color="black", linewidth=1,
             label=TARGET_LINE)
  ax.set_xlabel("Latency relative to target-only (batch 1)")
  ax.set_ylabel(metric or "quality")
  ax.set_title(title or report.setting_title(setting))
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=120, bbox_inches="tight")
  drawn = {}
  for line in ax.get_lines():
    xs, ys = line.get_xdata(), line.get_ydata()
    if line.get_label() == TARGET_LINE:  # axhline: axes-fraction x
      xs = [0.0, 1.0]
    drawn[line.get_label()] = ([float(x) for x in xs], [float(y) for y in ys])
  plt.close(fig)
  return drawn


def plot_all(aggs: Sequence[report.Aggregate], out_dir: str) -> list[str]:
  """One PNG per (pair, setting) that has a target-only run; their paths."""
  by_setting = report.curves(aggs)
  per_pair = {}
  for s in by_setting:
    per_pair[s[0]] = per_pair.get(s[0], 0) + 1
  paths = []
  for setting, by_curve in by_setting.items():
    if report.BASELINE_CURVE not in by_curve:
      continue
    path = os.path.join(out_dir, plot_file_name(setting,
                                                per_pair[setting[0]] > 1))
    plot_quality_vs_latency([a for pts in by_curve.values() for a in pts],
                            path)
    paths.append(path)
  return paths
