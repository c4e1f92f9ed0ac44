"""What the command line runs, as plain (gin-free) functions.

``specdec_jax.main`` binds these from gin files and flags; they can equally be
called from Python. Every mode reads its inputs, runs on the host's share of
the batch and lets only process 0 write results. Mode 'decode' is
``decode_run.run_decode`` (streamed, resumable JSONL); this module holds the
model specs and the eval / bench modes.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any, Sequence

import jax

from specdec_jax import decode_requests, decoding
from specdec_jax import tokenizer as tokenizer_lib
from specdec_jax.decode_run import DecodeReport, run_decode  # pylint: disable=unused-import
from specdec_jax.model_spec import (CHECKPOINT_FORMATS,  # pylint: disable=unused-import
                                    DEFAULT_MAX_INPUT_TOKENS, ROLES,
                                    ModelSpec)


def is_writer() -> bool:
  """Only process 0 writes results on a multi-host run."""
  return jax.process_index() == 0


def format_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
  """A plain-text table (the CLI's end-of-run summary)."""
  cells = [[f"{c:.3f}" if isinstance(c, float) else str(c) for c in r]
           for r in rows]
  widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h)
            for i, h in enumerate(header)]
  line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths))
  return "\n".join([line(header), line(["-" * w for w in widths])] +
                   [line(r) for r in cells])


def sampling_from(temperature: float = 0.0, top_k: int | None = None,
                  top_p: float | None = None):
  """A sampling strategy from plain values (0 = greedy)."""
  if top_k is not None and top_p is not None:
    raise ValueError("set top_k or top_p, not both")
  if top_k is not None:
    return decoding.TopK(top_k, temperature)
  if top_p is not None:
    return decoding.TopP(top_p, temperature)
  return decoding.Temperature(temperature)


@dataclasses.dataclass
class LoadedPair:
  """A drafter/verifier pair with its tokenizer, for the eval harness.

  Satisfies ``specdec_jax.eval.harness.Pair``: text examples in, text out.

  Attributes:
    name: label of the pair in result keys.
    drafter, verifier: models; q_params, p_params: their parameters.
    tokenizer: the shared Tokenizer.
    metrics: metric names (the primary first).
    max_new_tokens: generation budget.
    max_input_tokens: inputs are cut to this many ids
      (``decode_requests.fit_input``, as decode does); None: no limit.
  """

  name: str
  drafter: Any
  verifier: Any
  q_params: Any
  p_params: Any
  tokenizer: tokenizer_lib.Tokenizer
  metrics: tuple[str, ...]
  max_new_tokens: int
  max_input_tokens: int | None = None

  @property
  def is_encoder_decoder(self) -> bool:
    return self.verifier.is_encoder_decoder

  def encode(self, examples) -> dict:
    """Example texts -> ``generate`` keyword arguments (ragged ids)."""
    enc, tok = self.is_encoder_decoder, self.tokenizer
    rows = [decode_requests.fit_input(
        tok.encode(e["inputs"], add_eos=True) if enc else tok.encode(
            e["inputs"]), self.max_input_tokens, enc, tok.bos_id, tok.eos_id)
            for e in examples]
    return {"inputs": rows} if enc else {"prompts": rows}

  def decode(self, token_rows) -> list[str]:
    return [self.tokenizer.decode(list(map(int, r))) for r in token_rows]


def load_pair(drafter: ModelSpec, verifier: ModelSpec,
              metrics: Sequence[str], max_new_tokens: int,
              name: str | None = None):
  """Loads both models (a built-in default pair as a whole) for evaluation."""
  for spec in (drafter, verifier):
    spec.check()
  if drafter.default_pair and drafter.default_pair == verifier.default_pair:
    from specdec_jax.eval import default_models  # pylint: disable=g-import-not-at-top
    return default_models.load(verifier.default_pair, dtype=verifier.dtype)
  v_model, p_params, v_tok = verifier.load()
  d_model, q_params, d_tok = drafter.load(v_model)
  d_tok = v_tok if drafter.is_ngram else d_tok  # model-free: no tokenizer
  if v_tok is None or d_tok is None:
    raise ValueError("evaluation needs text: set ModelSpec.tokenizer for the "
                     "drafter and the verifier (the same SentencePiece "
                     "model)")
  tokenizer_lib.check_same_vocabulary(d_tok, v_tok)
  label = name or f"{drafter.preset or 'drafter'}->{verifier.preset or 'v'}"
  return LoadedPair(label, d_model, v_model, q_params, p_params, v_tok,
                    tuple(metrics), max_new_tokens,
                    verifier.input_limit(v_model))


def load_examples(dataset: str, split: str = "test",
                  limit: int | None = None, inputs_key: str = "inputs",
                  targets_key: str = "targets",
                  vocabulary: str | None = None,
                  extra_ids: int = 0) -> list[dict]:
  """Examples {'id', 'inputs', 'targets'} from one of:

  * a local JSONL / TSV file or glob (``specdec_jax.eval.datasets``);
  * ``'default:<pair>'``, a built-in default task's split;
  * a seqio task name (needs ``specdec_jax[seqio]``); the paper's benchmark
    tasks are registered on demand with ``vocabulary`` (a SentencePiece
    .model path) and ``extra_ids``.
  """
  from specdec_jax.eval import datasets  # pylint: disable=g-import-not-at-top
  if dataset.startswith("default:"):
    from specdec_jax.eval import default_models  # pylint: disable=g-import-not-at-top
    return default_models.examples(dataset.split(":", 1)[1], split, limit)
  try:
    datasets.resolve_paths(dataset)
    is_file = True
  except FileNotFoundError:
    is_file = False
  if is_file:
    return datasets.load(dataset, inputs_key=inputs_key,
                         targets_key=targets_key, limit=limit)
  if os.sep in dataset or dataset.endswith((".jsonl", ".tsv")):
    raise ValueError(f"dataset file not found: {dataset}")
  return _seqio_examples(dataset, split, limit, vocabulary, extra_ids)


def _seqio_examples(task_name: str, split: str, limit: int | None,
                    vocabulary: str | None, extra_ids: int) -> list[dict]:
  """Text examples of a seqio task (its '*_pretokenized' features)."""
  try:
    import seqio  # pylint: disable=g-import-not-at-top
    from specdec_jax import seqio as sj  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ValueError(f"dataset {task_name!r} is not a local file, and seqio "
                     f"is not installed to look it up as a task (pip install "
                     f"'specdec_jax[seqio]')") from None
  if task_name not in seqio.TaskRegistry.names() and vocabulary:
    sj.register_tasks(sj.sentencepiece_vocabulary(vocabulary, extra_ids))
  if task_name not in seqio.TaskRegistry.names():
    raise ValueError(f"unknown dataset {task_name!r}: not a local file and "
                     f"not a registered seqio task (see docs/seqio.md)")
  task = seqio.get_mixture_or_task(task_name)
  ds = task.get_dataset(sequence_length=None, split=split, shuffle=False)
  out = []
  for i, ex in enumerate(ds.as_numpy_iterator()):
    if limit is not None and i >= limit:
      break
    text = lambda k: ex[k].decode("utf-8") if isinstance(ex[k], bytes) \
        else str(ex[k])
    out.append(dict(id=str(i), inputs=text("inputs_pretokenized"),
                    targets=text("targets_pretokenized")))
  return out


def sweep_configs(sweep: dict) -> list:
  """The sweep's ``harness.RunConfig``s; every knob, temperature, top-p,
  gamma, budget, batch size and seed is validated here (nothing loaded).

  Args:
    sweep: as :func:`run_eval`'s.
  """
  from specdec_jax.eval import harness  # pylint: disable=g-import-not-at-top
  if not isinstance(sweep.get("methods"), dict) or not sweep["methods"]:
    raise ValueError("the sweep has no 'methods' ({name: {knob: [values]}}); "
                     "see configs/sweeps.py")
  seed = sweep.get("seed", 0)
  if isinstance(seed, bool) or not isinstance(seed, int) or not (
      0 <= seed < 2**32):
    raise ValueError(f"the sweep's seed must be an integer in [0, 2**32), got "
                     f"{seed!r}")
  top_p = [1.0 if p is None else p for p in sweep.get("top_p", [None])]
  return harness.grid(
      {m: dict(k) for m, k in sweep["methods"].items()},
      temperature=list(sweep.get("temperatures", [0.0])), top_p=top_p,
      gamma=list(sweep.get("gammas", [5])),
      max_new_tokens=sweep.get("max_new_tokens"),
      batch_size=sweep.get("batch_size", 1), seed=seed)


def warn_long_inputs(pair, examples: Sequence[dict]) -> int:
  """Warns (stderr) how many examples are cut to the maximum input length.

  The cut itself happens in the pair's ``encode`` (``LoadedPair`` and the
  default pairs apply the same rule as decode, ``decode_requests.fit_input``).

  Returns:
    The number of examples longer than the limit.
  """
  spec = getattr(pair, "spec", None)
  limit = getattr(pair, "max_input_tokens", None) or getattr(
      spec, "max_input_tokens", None)
  tok = getattr(pair, "tokenizer", None)
  if not limit or tok is None:
    return 0
  enc = pair.is_encoder_decoder
  extra = 1 if enc or tok.bos_id is not None else 0  # EOS or BOS
  long = sum(len(tok.encode(e["inputs"], add_bos=False)) + extra > limit
             for e in examples)
  if long:
    print(f"specdec_jax: warning: {long} of {len(examples)} examples have "
          f"more than {limit} input tokens (the verifier's max_input_tokens) "
          f"and are cut to it, as decode cuts long requests", file=sys.stderr)
  return long


def run_eval(pair, examples: Sequence[dict], sweep: dict,
             output_dir: str, repeats: int = 1, progress: bool = True):
  """Runs a sweep over examples; writes results.jsonl, summary.{json,md}
  and quality-vs-latency plots. Resumable: rerun to continue.

  Args:
    pair: LoadedPair or default_models.DefaultPair.
    examples: dicts with 'id', 'inputs', 'targets'.
    sweep: {'methods': {name: {knob: [values]}}, 'temperatures': [...],
      'top_p': [...], 'gammas': [...], 'max_new_tokens': int,
      'batch_size': int, 'seed': int} (configs/sweeps.py).
    output_dir: where results go (only process 0 writes).
    repeats: time each call this many times, keep the fastest.
    progress: progress bars.

  Returns:
    The per-method summaries (report.MethodSummary).
  """
  from specdec_jax.eval import harness, plots, report  # pylint: disable=g-import-not-at-top
  configs = sweep_configs(sweep)
  warn_long_inputs(pair, examples)
  os.makedirs(output_dir, exist_ok=True)
  path = os.path.join(output_dir, "results.jsonl")
  harness.run(pair, configs, examples, path, progress=progress,
              repeats=repeats)
  rows = harness.load_rows(path)
  targets = {str(e["id"]): e["targets"] for e in examples}
  aggs = report.aggregate(rows, targets, pair.metrics)
  summaries = report.summarize(aggs)
  if is_writer():
    report.write_summary(output_dir, aggs, summaries)
    plots.plot_all(aggs, output_dir)
  print(report.results_table(aggs), file=sys.stderr)
  print(report.summary_table(summaries), file=sys.stderr)
  return summaries
