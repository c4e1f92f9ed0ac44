"""A tiny seqio task for the end-to-end t5x eval test (needs seqio + TF).

t5x imports this module through ``MIXTURE_OR_TASK_MODULE``; it registers
'specdec_tiny_copy': 12 examples of random ids (vocabulary 64, EOS 1), with
a sequence-accuracy metric and :func:`speculative_metrics`.
"""

import numpy as np
import seqio
import tensorflow as tf

from specdec_jax.t5x.metrics import speculative_metrics

NAME = "specdec_tiny_copy"
VOCAB = seqio.PassThroughVocabulary(64, eos_id=1)


def examples() -> np.ndarray:
  """[12, 5] int32 input ids (the targets are the same ids)."""
  return np.random.default_rng(0).integers(2, 64, (12, 5)).astype(np.int32)


def _dataset(split, shuffle_files, seed=None):
  del split, shuffle_files, seed
  ids = examples()
  return tf.data.Dataset.from_tensor_slices({"inputs": ids, "targets": ids})


def sequence_accuracy(targets, predictions):
  hits = [list(t) == list(p) for t, p in zip(targets, predictions)]
  return {"sequence_accuracy": float(np.mean(hits))}


if NAME not in seqio.TaskRegistry.names():
  seqio.TaskRegistry.add(
      NAME,
      source=seqio.FunctionDataSource(_dataset, splits=["validation"]),
      preprocessors=[seqio.preprocessors.append_eos],
      output_features={"inputs": seqio.Feature(VOCAB),
                       "targets": seqio.Feature(VOCAB)},
      metric_fns=[sequence_accuracy, speculative_metrics])
