"""How much do the encoder-decoder default models use their input?

Teacher-forced validation loss of every size of a default family with (a)
the real inputs, (b) the inputs of other examples (a fixed permutation) and
(c) an empty input (EOS only). A model that reads its input loses much more
with (b) than (a); a model that only learned the targets' language (an
unconditional docstring LM) loses little.

    python -m tools.default_models.input_dependence --assets DIR --limit 256
"""

import argparse

import numpy as np

from specdec_jax.families import loader as dm
from tools.default_models import family_eval as dme


def measure_model(model, params, tok, spec, exs, seed: int = 0) -> dict:
  """{'real', 'shuffled', 'empty'} mean target-token losses of one model.

  Args:
    model, params: an encoder-decoder model and its parameters.
    tok: the family's tokenizer.
    spec: the task's ``default_models.TaskSpec``.
    exs: examples ({'inputs', 'targets'}), at least 2.
    seed: seed of the permutation that hands each example another's input.
  """
  if len(exs) < 2:
    raise ValueError(f"need at least 2 examples to shuffle inputs, got "
                     f"{len(exs)}")
  rows = dme.tokenize(tok, spec, exs)
  perm = np.random.default_rng(seed).permutation(len(rows))
  variants = {"real": rows,
              "shuffled": [(rows[perm[i]][0], r[1]) for i, r in enumerate(rows)],
              "empty": [([tok.eos_id], r[1]) for r in rows]}
  make = dme.batch_maker(spec, tok.eos_id, 0.0)
  return {k: dme.heldout_loss(model, params, v, make)
          for k, v in variants.items()}


def measure(fam, exs, seed: int = 0) -> dict:
  """{level: {'real', 'shuffled', 'empty'}} mean target-token losses.

  Args:
    fam: an encoder-decoder ``default_models.DefaultPair``.
    exs: examples ({'inputs', 'targets'}), at least 2.
    seed: seed of the permutation that hands each example another's input.
  """
  if not fam.is_encoder_decoder:
    raise ValueError(f"{fam.name!r} is decoder-only: its input is a prefix "
                     "of the same sequence, not a separate input")
  return {level: measure_model(*fam.model(level), fam.tokenizer, fam.spec,
                               exs, seed)
          for level in dm.LEVELS}


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--assets", default=dm.ASSETS)
  ap.add_argument("--pair", default="t5_codegen")
  ap.add_argument("--split", default="validation")
  ap.add_argument("--limit", type=int, default=256)
  args = ap.parse_args()
  fam = dm.load(args.pair, assets=args.assets)
  exs = dm.examples(args.pair, args.split, limit=args.limit)
  try:
    res = measure(fam, exs)
  except ValueError as e:
    raise SystemExit(f"input_dependence.py: {e}") from None
  print(f"{args.pair}, {len(exs)} {args.split} examples, mean target-token "
        "cross-entropy (nats):\n")
  print("| size | real input | other example's input | empty input | "
        "shuffled - real |")
  print("|---|---|---|---|---|")
  for level, loss in res.items():
    print(f"| {level} | {loss['real']:.3f} | {loss['shuffled']:.3f} | "
          f"{loss['empty']:.3f} | {loss['shuffled'] - loss['real']:.3f} |")


if __name__ == "__main__":
  main()
