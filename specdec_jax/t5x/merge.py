r"""Merges a drafter and a verifier T5X checkpoint into one T5X checkpoint.

t5x restores ONE checkpoint per model; the speculative Models of
:mod:`specdec_jax.t5x.models` hold both parameter trees, so their checkpoint
holds ``target/draft/...`` (the drafter's ``target`` tree) and
``target/target/...`` (the verifier's)::

    python -m specdec_jax.t5x.merge \
        --draft gs://t5-data/pretrained_models/t5x/t5_1_1_small/checkpoint_1000000 \
        --target gs://t5-data/pretrained_models/t5x/t5_1_1_large/checkpoint_1000000 \
        --output /ckpts/merged --step 0 \
        --draft_preset t5_1_1_small --target_preset t5_1_1_large

writes ``/ckpts/merged/checkpoint_0``, the ``CHECKPOINT_PATH`` of
``gin/t5x/spec_cascade_eval.gin``. Inputs may be legacy (msgpack +
TensorStore) or Orbax T5X checkpoints, a step directory or a model directory
(its latest step). Only the parameters are kept (no optimizer state). The
legacy output layout is written leaf by leaf, so host memory holds one array
at a time; ``--layout orbax`` reads both trees whole first.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

import jax.numpy as jnp
import numpy as np

from specdec_jax import models as models_lib
from specdec_jax.checkpoints import loader
from specdec_jax.checkpoints import t5x as t5x_ckpt
from specdec_jax.checkpoints import t5x_write


class _LazyLeaf:
  """One checkpoint leaf, read when ``np.asarray`` asks for it."""

  def __init__(self, leaf: loader.Leaf, dtype, where: str):
    self._leaf, self._dtype, self._where = leaf, dtype, where
    self.shape = tuple(leaf.shape)
    self.dtype = np.dtype(dtype if dtype is not None else leaf.dtype)

  def __array__(self, dtype=None, copy=None):
    del copy
    arr = loader.read_leaf(self._leaf, self._dtype, self._where)
    return arr if dtype is None else arr.astype(dtype)


def _tree(path: str, dtype, lazy: bool, what: str) -> dict:
  """The 'target' tree of a checkpoint (lazy leaves or numpy arrays)."""
  if not lazy:
    return t5x_ckpt.load_t5x_tree(path, dtype=dtype)
  flat = {}
  for leaf in t5x_ckpt.t5x_leaves(path):
    cast = dtype if jnp.issubdtype(leaf.dtype, jnp.floating) else None
    flat[leaf.path] = _LazyLeaf(leaf, cast, f"{what} checkpoint {path!r}")
  return models_lib.unflatten_params(flat)


def _check(tree: dict, preset: str | None, path: str, what: str) -> None:
  if set(tree) == {"draft", "target"}:
    raise ValueError(f"the {what} checkpoint {path!r} is already a merged "
                     f"drafter+verifier checkpoint; pass the {what}'s own "
                     f"checkpoint")
  if preset is not None:
    model = models_lib.get_model(preset)
    models_lib.check_params(tree, model.param_shapes(),
                            what=f"{what} checkpoint {path!r} ({preset})")


def merge(draft: str, target: str, output: str, step: int = 0, *,
          draft_preset: str | None = None, target_preset: str | None = None,
          dtype: str | None = None, layout: str = "legacy") -> str:
  """Writes ``<output>/checkpoint_<step>`` holding both parameter trees.

  Args:
    draft: the drafter's T5X checkpoint (step or model directory).
    target: the verifier's T5X checkpoint.
    output: directory to write the merged step directory into.
    step: step number of the merged checkpoint.
    draft_preset, target_preset: optional presets (e.g. 't5_1_1_small')
      the trees are checked against before anything is written.
    dtype: cast floating-point leaves ('float32', 'bfloat16'; None keeps).
    layout: 'legacy' (streamed) or 'orbax'.

  Returns:
    The path of the merged step directory.
  """
  if isinstance(step, bool) or int(step) != step or step < 0:
    raise ValueError(f"step must be an integer >= 0, got {step!r}")
  if layout not in ("legacy", "orbax"):
    raise ValueError(f"layout must be 'legacy' or 'orbax', got {layout!r}")
  dt = loader.target_dtype(dtype)
  lazy = layout == "legacy"
  trees = {}
  for what, path, preset in (("draft", draft, draft_preset),
                             ("target", target, target_preset)):
    trees[what] = _tree(path, dt, lazy, what)
    _check(trees[what], preset, path, what)
  out = os.path.join(output, f"checkpoint_{int(step)}")
  t5x_write.save_t5x(out, trees, step=int(step), layout=layout)
  return out


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(
      prog="python -m specdec_jax.t5x.merge",
      description="Merge a drafter and a verifier T5X checkpoint into one "
      "checkpoint (target/draft/..., target/target/...) for "
      "specdec_jax.t5x.models.")
  p.add_argument("--draft", required=True,
                 help="drafter T5X checkpoint (step or model directory)")
  p.add_argument("--target", required=True,
                 help="verifier T5X checkpoint (step or model directory)")
  p.add_argument("--output", required=True,
                 help="directory to write checkpoint_<step> into")
  p.add_argument("--step", type=int, default=0,
                 help="step of the merged checkpoint (default 0)")
  p.add_argument("--draft_preset", default=None,
                 help="check the drafter against this preset")
  p.add_argument("--target_preset", default=None,
                 help="check the verifier against this preset")
  p.add_argument("--dtype", default=None, choices=["float32", "bfloat16"],
                 help="cast the parameters (default: keep)")
  p.add_argument("--layout", default="legacy", choices=["legacy", "orbax"],
                 help="output layout (default legacy, streamed)")
  return p


def main(argv: Sequence[str] | None = None) -> int:
  """Command-line entry point; returns the exit status."""
  args = _parser().parse_args(argv)
  try:
    out = merge(args.draft, args.target, args.output, args.step,
                draft_preset=args.draft_preset,
                target_preset=args.target_preset, dtype=args.dtype,
                layout=args.layout)
  except ValueError as e:
    print(f"merge: error: {e}", file=sys.stderr)
    return 2
  print(out)
  return 0


if __name__ == "__main__":
  sys.exit(main())
