"""Compares two ``bench_decode.py`` runs (e.g. before / after a change).

Usage: python scripts/compare_bench_decode.py --before BEFORE.json --after AFTER.json

For every (batch, temperature, gamma, method) row present in both runs it
prints the speedup over target-only (each run's own median of back-to-back
ratios), the tokens per verifier call, the target-only tokens/s, and the
after / before ratio of the speedups; then the median of those ratios per
pair and overall. Identical tokens per call in both runs show that the two
decoded the same tokens (same acceptance), so only speed can differ.

    python scripts/compare_bench_decode.py \\
        --before benchmarks/results/core_reshape/before_random_gemma.json \\
        --after benchmarks/results/core_reshape/after_random_gemma.json \\
        --title random-gemma
"""

from __future__ import annotations

import argparse
import json
import statistics


def _key(r: dict) -> tuple:
  return (r["batch"], r["temperature"], r["gamma"], r["method"])


def compare(before: dict, after: dict) -> list[dict]:
  """One row per config present in both runs (drafter/target-only too)."""
  b = {_key(r): r for r in before["rows"]}
  rows = []
  for r in after["rows"]:
    old = b.get(_key(r))
    if old is None:
      continue
    rows.append(dict(
        batch=r["batch"], temperature=r["temperature"], gamma=r["gamma"],
        method=r["method"], speedup_before=old["speedup"],
        speedup_after=r["speedup"],
        ratio=r["speedup"] / old["speedup"] if old["speedup"] else None,
        tokens_per_s_before=old["tokens_per_s"],
        tokens_per_s_after=r["tokens_per_s"],
        block_efficiency_before=old.get("block_efficiency"),
        block_efficiency_after=r.get("block_efficiency")))
  return rows


def markdown(title: str, rows: list[dict]) -> str:
  fmt = lambda x, d=2: "-" if x is None else f"{x:.{d}f}"
  lines = [f"### {title}", "",
           "| batch | T | gamma | method | speedup before | speedup after | "
           "after/before | tokens/call before | tokens/call after | "
           "tokens/s before | tokens/s after |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(
        f"| {r['batch']} | {r['temperature']:g} | {r['gamma'] or '-'} | "
        f"{r['method']} | {fmt(r['speedup_before'])}x | "
        f"{fmt(r['speedup_after'])}x | {fmt(r['ratio'], 3)} | "
        f"{fmt(r['block_efficiency_before'])} | "
        f"{fmt(r['block_efficiency_after'])} | "
        f"{fmt(r['tokens_per_s_before'], 1)} | "
        f"{fmt(r['tokens_per_s_after'], 1)} |")
  spec = [r["ratio"] for r in rows
          if r["gamma"] and r["ratio"] is not None]
  same_rows = [r for r in rows if r["gamma"] and r["ratio"] is not None
               and r["block_efficiency_before"] == r["block_efficiency_after"]]
  same = [r["ratio"] for r in same_rows]
  lines += ["", f"Median after/before speedup ratio over the {len(spec)} "
            f"speculative rows: {statistics.median(spec):.3f} (min "
            f"{min(spec):.3f}, max {max(spec):.3f}); tokens per verifier "
            f"call identical in {len(same)} of {len(spec)} rows."]
  if same and len(same) < len(spec):
    lines.append(
        f"Over the {len(same)} rows that decoded the same tokens (same "
        f"tokens per call, so only speed can differ): median "
        f"{statistics.median(same):.3f} (min {min(same):.3f}, max "
        f"{max(same):.3f}).")
  lines.append("")
  return "\n".join(lines)


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--before", required=True)
  ap.add_argument("--after", required=True)
  ap.add_argument("--title", required=True)
  args = ap.parse_args()
  with open(args.before) as f:
    before = json.load(f)
  with open(args.after) as f:
    after = json.load(f)
  print(markdown(args.title, compare(before, after)))


if __name__ == "__main__":
  main()
