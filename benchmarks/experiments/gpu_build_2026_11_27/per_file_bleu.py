"""Corpus BLEU of each size per source file of the test split.

Reads the outputs that ``scripts/family_significance.py --predictions P``
wrote and the test split's example ids (``file:line:function``), and prints a
markdown table: BLEU of small / medium / large on each of the files with the
most examples, and on the split without the one of those (>= 20 examples)
where the large scores the highest BLEU.

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
  by_file = collections.defaultdict(list)  # file -> example indices
  for i, e in enumerate(exs):
    by_file[e["id"].split(":")[0]].append(i)

  def scores(idx):
    return [metrics.bleu([d["targets"][i] for i in idx],
                         [d[lv][i] for i in idx]) for lv in LEVELS]

  def row(name, idx, sc):
    order = "yes" if sc[2] > sc[1] > sc[0] else "no"
    return (f"| {name} | {len(idx)} | " +
            " | ".join(f"{x:.2f}" for x in sc) + f" | {order} |")

  print(f"{len(exs)} test examples from {len(by_file)} files\n")
  print("| file | examples | small | medium | large | large > medium > "
        "small |")
  print("|---|---|---|---|---|---|")
  everything = list(range(len(exs)))
  print(row("all", everything, scores(everything)))
  top_files = sorted(by_file, key=lambda f: -len(by_file[f]))[:top]
  per_file = {f: scores(by_file[f]) for f in top_files}
  for f in top_files:
    print(row(f, by_file[f], per_file[f]))
  # the file (of those shown, >= 20 examples) where the large scores most
  best = max((f for f in top_files if len(by_file[f]) >= 20),
             key=lambda f: per_file[f][2])
  rest = [i for i in everything if i not in set(by_file[best])]
  print(row(f"all but {best}", rest, scores(rest)))


if __name__ == "__main__":
  main(sys.argv[1], *(int(a) if a.isdigit() else a for a in sys.argv[2:]))
