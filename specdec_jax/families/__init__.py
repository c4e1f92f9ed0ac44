"""The shipped default model families: load them and their examples.

    from specdec_jax import families
    pair = families.load("t5_codegen")          # small / medium / large
    exs = families.examples("t5_codegen", "test", limit=8)

:mod:`specdec_jax.families.loader` loads the weights and tokenizers under
``specdec_jax/assets/default_models``; :mod:`specdec_jax.families.corpus`
makes the tasks' examples from this machine's CPython standard library. The
factory that trains them (corpus selection, pretraining, distillation) is
``tools/default_models/`` in a source checkout; the engine never imports it.
"""

from specdec_jax.families import corpus
from specdec_jax.families.loader import (
    ASSETS, BENCHMARK_NAMES, BUILD_HINT, LEVEL_DIRS, LEVELS, METADATA, PAIRS,
    SPM_OPTIONS, TASKS, TOKENIZER, BenchmarkPair, DefaultPair, TaskSpec,
    encode_inputs, encode_targets, examples, load, load_pair_for_benchmark,
    metadata)

__all__ = [
    "ASSETS", "BENCHMARK_NAMES", "BUILD_HINT", "BenchmarkPair", "DefaultPair",
    "LEVELS", "LEVEL_DIRS", "METADATA", "PAIRS", "SPM_OPTIONS", "TASKS",
    "TOKENIZER", "TaskSpec", "corpus", "encode_inputs", "encode_targets",
    "examples", "load", "load_pair_for_benchmark", "metadata",
]
