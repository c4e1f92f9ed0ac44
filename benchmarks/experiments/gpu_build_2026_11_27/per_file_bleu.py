"""Corpus BLEU of each size per source file of the test split.

Reads the outputs that ``scripts/family_significance.py --predictions P``
wrote and the test split's example ids (``file:line:function``), and prints a
markdown table: BLEU of small / medium / large on each of the files with the
most examples, and on the split without its largest-BLEU file.

    PYTHONPATH=. python benchmarks/experiments/gpu_build_2026_11_27/per_file_bleu.py \
        P [TOP] [PAIR]
"""

import collections
import json
import sys

from specdec_jax.eval import default_models as dm
from specdec_jax.eval import metrics

LEVELS = ("small", "medium", "large")


def main(path: str, top: int = 8, pair: str = "t5_codegen") -> None:
  d = json.load(open(path))
  exs = dm.examples(pair, "test")
  if [e["targets"] for e in exs] != d["targets"]:
    raise SystemExit(f"{path}: its targets are not {pair}'s test split")
  files = [e["id"].split(":")[0] for e in exs]
  counts = collections.Counter(files)

  def row(name, idx):
    scores = [metrics.bleu([d["targets"][i] for i in idx],
                           [d[lv][i] for i in idx]) for lv in LEVELS]
    order = "yes" if scores[2] > scores[1] > scores[0] else "no"
    return (f"| {name} | {len(idx)} | " +
            " | ".join(f"{s:.2f}" for s in scores) + f" | {order} |")

  print(f"{len(exs)} test examples from {len(counts)} files\n")
  print("| file | examples | small | medium | large | large > medium > "
        "small |")
  print("|---|---|---|---|---|---|")
  print(row("all", list(range(len(exs)))))
  for f, _ in counts.most_common(top):
    print(row(f, [i for i, g in enumerate(files) if g == f]))
  best = max(counts, key=lambda f: metrics.bleu(
      [d["targets"][i] for i, g in enumerate(files) if g == f],
      [d["large"][i] for i, g in enumerate(files) if g == f])
      if counts[f] >= 20 else -1)
  print(row(f"all but {best}", [i for i, g in enumerate(files) if g != best]))


if __name__ == "__main__":
  main(sys.argv[1], *(int(a) if a.isdigit() else a for a in sys.argv[2:]))
