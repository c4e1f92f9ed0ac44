"""The main job's auto rows as markdown (``auto_rows.report_rows``' dicts):
the table printed at the end of the job and the section of summary.md."""

from __future__ import annotations

from typing import Mapping, Sequence


def _f(x, fmt="{:.2f}") -> str:
  return "-" if x is None else fmt.format(x)


def rows_table(rows: Sequence[Mapping]) -> str:
  """Markdown: one line per auto row (what it resolved to, its measured
  latency and quality on the sweep's split, the tune's own numbers)."""
  lines = ["| pair | row | resolved to | rel. latency | speedup | quality "
           "| tune: x target-only | tune s |",
           "|---|---|---|---|---|---|---|---|"]
  for r in rows:
    q = "-" if r["quality"] is None else f"{r['quality']:.2f} {r['metric']}"
    tuned = f"{r['tune_s']:.1f}" + (" (reused)" if r["reused"] else "")
    lines.append(f"| {r['pair']} | {r['label']} | {r['resolved']} | "
                 f"{_f(r['relative_latency'])} | "
                 f"{_f(r['speedup'], '{:.2f}x')} | {q} | "
                 f"{r['tune_ratio']:.2f}x | {tuned} |")
  return "\n".join(lines) + "\n"


def append_to_summary(md_path: str, rows: Sequence[Mapping]) -> None:
  """Adds the auto rows' section to summary.md."""
  with open(md_path, "a", encoding="utf-8") as f:
    f.write("\n\n## auto rows\n\n`auto`: the fastest lossless strategy "
            "tuned on the dev split; `auto (quality budget)`: the best "
            "quality within the latency budget. Rel. latency and quality: "
            "the sweep's measured rows of the config each resolved to.\n\n"
            + rows_table(rows))
