"""seqio Tasks for the paper's benchmarks and for local files (optional).

Needs the ``[seqio]`` extra (seqio + TensorFlow, ~2.4 GB):
``pip install 'specdec_jax[seqio]'``. Nothing else in specdec_jax imports
this package, seqio or TensorFlow. See docs/seqio.md.

    from specdec_jax import seqio as sj_seqio
    vocab = sj_seqio.sentencepiece_vocabulary('/path/spm.model', extra_ids=100)
    sj_seqio.register_tasks(vocab)              # specdec_wmt14_en_de, ...
    sj_seqio.register_local_task('my_qa', 'qa.jsonl', vocab,
                                 inputs_key='question', targets_key='answers')
"""

import os

# Silence TensorFlow's C++ start-up logging before anything imports it.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

try:
  import seqio as _seqio  # noqa: F401  pylint: disable=g-import-not-at-top
  import tensorflow as _tf  # noqa: F401  pylint: disable=g-import-not-at-top
except ImportError as e:
  raise ImportError(
      f"specdec_jax.seqio needs seqio and TensorFlow ({e}); install them with "
      f"`pip install 'specdec_jax[seqio]'`, or use specdec_jax.eval.datasets "
      f"for local files without TensorFlow") from e

# pylint: disable=g-import-not-at-top,g-bad-import-order
from specdec_jax.seqio.tasks import BENCHMARKS
from specdec_jax.seqio.tasks import Benchmark
from specdec_jax.seqio.tasks import make_benchmark_task
from specdec_jax.seqio.tasks import metric_fn
from specdec_jax.seqio.tasks import output_features
from specdec_jax.seqio.tasks import register_local_task
from specdec_jax.seqio.tasks import register_mbpp_task
from specdec_jax.seqio.tasks import register_tasks
from specdec_jax.seqio.tasks import sentencepiece_vocabulary

__all__ = [
    "BENCHMARKS", "Benchmark", "make_benchmark_task", "metric_fn",
    "output_features", "register_local_task", "register_mbpp_task",
    "register_tasks", "sentencepiece_vocabulary",
]
