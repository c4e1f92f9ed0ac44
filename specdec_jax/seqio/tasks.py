"""seqio Tasks: the paper's benchmarks (TFDS) and any local JSONL/TSV file.

Every task has the text-to-text features 'inputs' and 'targets' (tokenized
with the given vocabulary, EOS appended after trimming) and keeps the raw
strings as 'inputs_pretokenized' / 'targets_pretokenized'. Metric functions
are those of :mod:`specdec_jax.eval.metrics` (0-100 scale); tasks with several
gold answers keep them in an 'answers' feature and score against all of them.

    =========================  ================================  ============
    task (prefix 'specdec_')   TFDS name : eval split            metrics
    =========================  ================================  ============
    wmt14_en_de                wmt14_translate/de-en:1.0.0 :     bleu
                               validation (newstest2013, 3000)
    cnn_dailymail              cnn_dailymail:3.4.0 : validation  rouge1/2/Lsum
    xsum                       xsum:1.1.0 : validation           rouge1/2/Lsum
    gsm8k                      gsm8k:1.0.0 : test                gsm8k_accuracy
    squad_v2                   squad/v2.0:3.0.0 : validation     exact_match,f1
    web_questions              web_questions:1.0.0 : test        exact_match,f1
    natural_questions_open     natural_questions_open:1.0.0 :    exact_match,f1
                               validation
    trivia_qa                  trivia_qa/rc.nocontext:1.1.0 :    exact_match,f1
                               validation
    mbpp                       (not in TFDS) local mbpp.jsonl :  code_exact_
                               test (task ids 11-510)            match
    =========================  ================================  ============
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import seqio
import tensorflow as tf

from specdec_jax.eval import datasets
from specdec_jax.eval import metrics as metrics_lib
from specdec_jax.seqio import preprocessors as pp

ExampleFn = Callable[[Mapping[str, tf.Tensor]], Mapping[str, tf.Tensor]]


@dataclasses.dataclass(frozen=True)
class Benchmark:
  """One benchmark of the paper.

  Attributes:
    name: short name; the registered task is ``prefix + name``.
    tfds_name: TFDS ``name/config:version``; None when not in TFDS.
    splits: the splits the task offers.
    eval_split: the split the paper-style evaluation uses.
    preprocess: raw example -> {'inputs', 'targets'[, 'answers']}.
    metrics: names in :data:`specdec_jax.eval.metrics.METRICS`.
    multi_answer: whether 'answers' holds every gold answer.
  """
  name: str
  tfds_name: str | None
  splits: tuple[str, ...]
  eval_split: str
  preprocess: ExampleFn
  metrics: tuple[str, ...]
  multi_answer: bool = False


_QA = ("exact_match", "f1")
_ROUGE = ("rouge1", "rouge2", "rougeLsum")

BENCHMARKS: dict[str, Benchmark] = {b.name: b for b in [
    Benchmark("wmt14_en_de", "wmt14_translate/de-en:1.0.0",
              ("train", "validation", "test"), "validation",
              pp.translate_en_de, ("bleu",)),
    Benchmark("cnn_dailymail", "cnn_dailymail:3.4.0",
              ("train", "validation", "test"), "validation",
              functools.partial(pp.summarize, article_key="article",
                                summary_key="highlights"), _ROUGE),
    Benchmark("xsum", "xsum:1.1.0", ("train", "validation", "test"),
              "validation",
              functools.partial(pp.summarize, article_key="document",
                                summary_key="summary"), _ROUGE),
    Benchmark("gsm8k", "gsm8k:1.0.0", ("train", "test"), "test", pp.gsm8k,
              ("gsm8k_accuracy",)),
    Benchmark("squad_v2", "squad/v2.0:3.0.0", ("train", "validation"),
              "validation", pp.squad_v2, _QA, multi_answer=True),
    Benchmark("web_questions", "web_questions:1.0.0", ("train", "test"),
              "test", functools.partial(pp.closed_book_qa,
                                        answers_key="answers"),
              _QA, multi_answer=True),
    Benchmark("natural_questions_open", "natural_questions_open:1.0.0",
              ("train", "validation"), "validation",
              functools.partial(pp.closed_book_qa, answers_key="answer"),
              _QA, multi_answer=True),
    Benchmark("trivia_qa", "trivia_qa/rc.nocontext:1.1.0",
              ("train", "validation"), "validation", pp.trivia_qa, _QA,
              multi_answer=True),
    Benchmark("mbpp", None, ("prompt", "test", "validation", "train"), "test",
              pp.mbpp, ("code_exact_match",)),
]}

# MBPP's standard split by task id (Austin et al. 2021): 1-10 few-shot
# prompts, 11-510 test, 511-600 validation, 601-974 train.
MBPP_SPLITS = {"prompt": (1, 10), "test": (11, 510), "validation": (511, 600),
               "train": (601, 974)}


def sentencepiece_vocabulary(model_path: str, extra_ids: int = 0
                             ) -> seqio.SentencePieceVocabulary:
  """A seqio vocabulary from a SentencePiece ``.model`` file.

  Args:
    model_path: local or gs:// path of the model.
    extra_ids: sentinel ids appended after the pieces (100 for T5's public
      vocabulary, 0 for Gemma).
  """
  if not tf.io.gfile.exists(model_path):
    raise FileNotFoundError(f"SentencePiece model {model_path!r} does not "
                            f"exist")
  return seqio.SentencePieceVocabulary(model_path, extra_ids=extra_ids)


def output_features(vocabulary: seqio.Vocabulary,
                    add_eos_to_inputs: bool = True
                    ) -> dict[str, seqio.Feature]:
  """'inputs' and 'targets' features over one vocabulary.

  Args:
    vocabulary: shared by drafter and verifier.
    add_eos_to_inputs: True for encoder-decoder (T5); False for a
      decoder-only prompt (Gemma), where EOS must not end the prompt.
  """
  if not isinstance(vocabulary, seqio.Vocabulary):
    raise TypeError(f"vocabulary must be a seqio.Vocabulary (see "
                    f"sentencepiece_vocabulary), got "
                    f"{type(vocabulary).__name__}")
  return {"inputs": seqio.Feature(vocabulary, add_eos=add_eos_to_inputs),
          "targets": seqio.Feature(vocabulary, add_eos=True)}


def metric_fn(names: Sequence[str]) -> Callable[..., dict[str, float]]:
  """A seqio metric function ``(targets, predictions) -> {name: score}``."""
  names = metrics_lib.check_names(names)

  def compute(targets, predictions):
    return metrics_lib.compute(names, list(targets), list(predictions))

  compute.__name__ = "_".join(names)
  return compute


def _text(value: Any) -> str:
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def answers_postprocessor(output: str, example: Mapping[str, Any] | None = None,
                          is_target: bool = False):
  """seqio postprocess_fn: a target becomes the example's 'answers' list."""
  if not is_target:
    return output
  if example is None or "answers" not in example:
    raise ValueError("answers_postprocessor needs the example's 'answers' "
                     "feature; keep it in the task's preprocessed examples")
  return [_text(a) for a in np.asarray(example["answers"]).reshape(-1)]


def _preprocessors(preprocess: ExampleFn | None,
                   prompt_prefix: str) -> list[Any]:
  steps = [seqio.map_over_dataset(preprocess)] if preprocess else []
  if prompt_prefix:
    steps.append(seqio.map_over_dataset(
        functools.partial(pp.add_prompt_prefix, prefix=prompt_prefix)))
  return steps + [seqio.preprocessors.tokenize, seqio.CacheDatasetPlaceholder(),
                  seqio.preprocessors.append_eos_after_trim]


def _task(name: str, source: seqio.DataSource, preprocess: ExampleFn | None,
          metric_names: Sequence[str], multi_answer: bool, prompt_prefix: str,
          features: Mapping[str, seqio.Feature]) -> seqio.Task:
  return seqio.Task(
      name, source=source, output_features=features,
      preprocessors=_preprocessors(preprocess, prompt_prefix),
      postprocess_fn=answers_postprocessor if multi_answer else None,
      metric_fns=[metric_fn(metric_names)])


def make_benchmark_task(benchmark: str, vocabulary: seqio.Vocabulary, *,
                        name: str | None = None,
                        source: seqio.DataSource | None = None,
                        prompt_prefix: str = "",
                        tfds_data_dir: str | None = None,
                        features: Mapping[str, seqio.Feature] | None = None
                        ) -> seqio.Task:
  """An (unregistered) seqio Task for one benchmark.

  Args:
    benchmark: a key of :data:`BENCHMARKS`.
    vocabulary: the shared SentencePiece vocabulary.
    name: task name (default ``'specdec_' + benchmark``).
    source: the raw examples; default the TFDS source (MBPP has none: use
      :func:`register_mbpp_task`). Any source whose examples carry the TFDS
      feature keys works, e.g. a FunctionDataSource over your own copy.
    prompt_prefix: text put before every input (few-shot exemplars).
    tfds_data_dir: where TFDS keeps prepared datasets (default ~/tensorflow_
      datasets; nothing is downloaded until you build the dataset).
    features: output features (default :func:`output_features`).
  """
  if benchmark not in BENCHMARKS:
    raise ValueError(f"unknown benchmark {benchmark!r}; choose from "
                     f"{sorted(BENCHMARKS)}")
  b = BENCHMARKS[benchmark]
  if source is None:
    if b.tfds_name is None:
      raise ValueError(f"{benchmark!r} is not in TFDS; pass source= or use "
                       f"register_mbpp_task(path, vocabulary)")
    source = seqio.TfdsDataSource(b.tfds_name, tfds_data_dir=tfds_data_dir,
                                  splits=b.splits)
  return _task(name or f"specdec_{benchmark}", source, b.preprocess,
               b.metrics, b.multi_answer, prompt_prefix,
               features or output_features(vocabulary))


def _add(task: seqio.Task, overwrite: bool) -> seqio.Task:
  if task.name in seqio.TaskRegistry.names():
    if not overwrite:
      raise ValueError(f"a seqio task named {task.name!r} is already "
                       f"registered; pass overwrite=True or another name")
    seqio.TaskRegistry.remove(task.name)
  seqio.TaskRegistry.add_provider(task.name, task)
  return task


def register_tasks(vocabulary: seqio.Vocabulary, *,
                   benchmarks: Sequence[str] | None = None,
                   prefix: str = "specdec_",
                   prompt_prefix: Mapping[str, str] | None = None,
                   tfds_data_dir: str | None = None,
                   features: Mapping[str, seqio.Feature] | None = None,
                   overwrite: bool = False) -> list[str]:
  """Registers the TFDS benchmarks as seqio tasks ``prefix + name``.

  Args:
    vocabulary: the shared SentencePiece vocabulary.
    benchmarks: which ones (default: every benchmark with a TFDS name).
    prefix: task-name prefix.
    prompt_prefix: per-benchmark text put before every input.
    tfds_data_dir: TFDS data directory.
    features: output features (default :func:`output_features`).
    overwrite: replace tasks of the same name instead of raising.

  Returns:
    The registered task names.
  """
  chosen = ([n for n, b in BENCHMARKS.items() if b.tfds_name]
            if benchmarks is None else list(benchmarks))
  prompt_prefix = dict(prompt_prefix or {})
  stray = sorted(set(prompt_prefix) - set(chosen))
  if stray:
    raise ValueError(f"prompt_prefix names benchmarks not registered here: "
                     f"{stray}")
  names = []
  for b in chosen:
    task = make_benchmark_task(b, vocabulary, name=prefix + b,
                               prompt_prefix=prompt_prefix.get(b, ""),
                               tfds_data_dir=tfds_data_dir, features=features)
    names.append(_add(task, overwrite).name)
  return names


def _split_patterns(path_or_glob, split: str) -> dict[str, list[str]]:
  """{split: files}; raises FileNotFoundError early."""
  by_split = (dict(path_or_glob) if isinstance(path_or_glob, Mapping)
              else {split: path_or_glob})
  return {s: datasets.resolve_paths(p) for s, p in by_split.items()}


_STRING = tf.TensorSpec([], tf.string)


def _examples_dataset(rows: Callable[[], Any],
                      signature: Mapping[str, tf.TensorSpec]
                      ) -> tf.data.Dataset:
  """A dataset of the dicts ``rows()`` yields (read lazily, in order)."""
  return tf.data.Dataset.from_generator(rows, output_signature=dict(signature))


def register_local_task(name: str, path_or_glob: str | Mapping[str, str],
                        vocabulary: seqio.Vocabulary, *,
                        format: str | None = None,
                        inputs_key: str = "inputs",
                        targets_key: str = "targets", id_key: str = "id",
                        fields: Sequence[str] | None = None,
                        metrics: Sequence[str] = ("exact_match", "f1"),
                        split: str = "validation", prompt_prefix: str = "",
                        features: Mapping[str, seqio.Feature] | None = None,
                        overwrite: bool = False) -> seqio.Task:
  """Registers a seqio task over local JSONL/TSV files (no TFDS).

  Files are read with :func:`specdec_jax.eval.datasets.load` (same fields,
  ids and errors as the CLI's loader) through a seqio.FunctionDataSource.
  Examples carry 'id', 'inputs', 'targets' (the first reference, '' if none)
  and 'answers' (every reference); metrics score against 'answers'.

  Args:
    name: the task name.
    path_or_glob: a file or glob for ``split``, or {split: file or glob}.
    vocabulary: the shared SentencePiece vocabulary.
    format: 'jsonl' or 'tsv' (default: from the file extension).
    inputs_key, targets_key, id_key, fields: as in ``datasets.load``.
    metrics: names in :data:`specdec_jax.eval.metrics.METRICS`.
    split: the split name when ``path_or_glob`` is a single pattern.
    prompt_prefix: text put before every input.
    features: output features (default :func:`output_features`).
    overwrite: replace a task of the same name instead of raising.

  Returns:
    The registered Task.
  """
  metric_names = metrics_lib.check_names(metrics)
  files = _split_patterns(path_or_glob, split)
  load = functools.partial(datasets.load, format=format, inputs_key=inputs_key,
                           targets_key=targets_key, id_key=id_key,
                           fields=fields)
  for paths in files.values():
    load(paths, limit=1)  # wrong keys or a bad first line fail right here

  def rows(s):
    for ex in load(files[s]):
      refs = [ex["targets"]] if isinstance(ex["targets"], str) \
          else ex["targets"]
      yield {"id": ex["id"], "inputs": ex["inputs"],
             "targets": refs[0] if refs else "", "answers": refs}

  def dataset_fn(split, shuffle_files, seed=None):
    del shuffle_files, seed  # one pass in file order; Task.get_dataset shuffles
    return _examples_dataset(
        functools.partial(rows, split),
        {"id": _STRING, "inputs": _STRING, "targets": _STRING,
         "answers": tf.TensorSpec([None], tf.string)})

  source = seqio.FunctionDataSource(dataset_fn, splits=list(files))
  task = _task(name, source, None, metric_names, True, prompt_prefix,
               features or output_features(vocabulary))
  return _add(task, overwrite)


def register_mbpp_task(path_or_glob: str, vocabulary: seqio.Vocabulary, *,
                       name: str = "specdec_mbpp", prompt_prefix: str = "",
                       features: Mapping[str, seqio.Feature] | None = None,
                       overwrite: bool = False) -> seqio.Task:
  """Registers MBPP from its JSONL file (MBPP is not in TFDS).

  ``path_or_glob`` is google-research's ``mbpp.jsonl`` (fields task_id,
  text, code, test_list) or any subset of it; splits follow
  :data:`MBPP_SPLITS` by task id.
  """
  paths = datasets.resolve_paths(path_or_glob)

  def rows(split):
    lo, hi = MBPP_SPLITS[split]
    for path in paths:
      for lineno, r in datasets.iter_jsonl(path):
        missing = [k for k in ("task_id", "text", "code", "test_list")
                   if k not in r]
        if missing:
          raise datasets.DatasetError(f"{path}:{lineno}: MBPP record lacks "
                                      f"{missing}")
        if lo <= int(r["task_id"]) <= hi:
          yield {"task_id": int(r["task_id"]), "text": r["text"],
                 "code": r["code"], "test_list": list(r["test_list"])}

  def dataset_fn(split, shuffle_files, seed=None):
    del shuffle_files, seed
    return _examples_dataset(
        functools.partial(rows, split),
        {"task_id": tf.TensorSpec([], tf.int64), "text": _STRING,
         "code": _STRING, "test_list": tf.TensorSpec([None], tf.string)})

  b = BENCHMARKS["mbpp"]
  source = seqio.FunctionDataSource(dataset_fn, splits=list(MBPP_SPLITS))
  task = _task(name, source, b.preprocess, b.metrics, False, prompt_prefix,
               features or output_features(vocabulary))
  return _add(task, overwrite)
