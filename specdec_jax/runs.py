"""What the command line runs, as plain (gin-free) functions.

``specdec_jax.main`` binds these from gin files and flags; they can equally be
called from Python. Every mode reads its inputs, runs on the host's share of
the batch and lets only process 0 write results. Mode 'decode' is
``decode_run.run_decode`` (streamed, resumable JSONL); this module holds the
model specs and the eval / bench modes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Any, Sequence

import jax
import numpy as np

from specdec_jax import decode_requests, decoding, models
from specdec_jax import tokenizer as tokenizer_lib
from specdec_jax.decode_run import DecodeReport, run_decode  # pylint: disable=unused-import


# Built-in defaults of ModelSpec.max_input_tokens for random and checkpoint
# models: T5 v1.1 was pre-trained on 512-token inputs (t5x's default
# 'inputs' feature length); Gemma 1 and 2 have an 8192-token context.
DEFAULT_MAX_INPUT_TOKENS = {"t5": 512, "gemma": 8192}
CHECKPOINT_FORMATS = ("auto", "native", "hf", "t5x", "t5x_orbax", "gemma")
# ModelSpec roles; with a default_pair each names one of its models (and its
# asset directory).
ROLES = ("drafter", "medium", "verifier")


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """Where a model comes from.

  Exactly one source is used, in this order: ``default_pair`` (a built-in
  trained pair, see ``specdec_jax.eval.default_models``), ``checkpoint`` (any
  supported format, see ``specdec_jax.checkpoints``), else random weights
  for ``preset`` (for smoke tests and benchmarks only).

  Attributes:
    preset: model preset name (``specdec_jax.models.PRESETS``); required for
      checkpoints that carry no config (T5X, official Gemma).
    checkpoint: checkpoint path (local or gs://).
    checkpoint_format: 'auto', 'native', 'hf', 't5x', 't5x_orbax', 'gemma'.
    dtype: parameter dtype after loading ('bfloat16' or 'float32').
    tokenizer: SentencePiece .model path (None: token ids in and out).
    default_pair: name of a built-in pair ('t5_codegen', ...).
    role: 'drafter', 'medium' or 'verifier': which model of a
      ``default_pair`` (small, medium, large; 'medium' is a hierarchy's
      middle level, gin/hierarchies/).
    seed: seed of random weights (>= 0).
    max_input_tokens: the longest model input (T5: encoder ids incl. EOS;
      Gemma: prompt incl. BOS). Longer requests are cut to it with a warning
      (``decode_requests.fit_input``), in decode and eval alike. None: the
      built-in pair's task limit (320 for t5_codegen and
      gemma_completion), else :data:`DEFAULT_MAX_INPUT_TOKENS` of the family
      (T5 512, Gemma 8192). Only the verifier's applies.
  """

  preset: str | None = None
  checkpoint: str | None = None
  checkpoint_format: str = "auto"
  dtype: str = "float32"
  tokenizer: str | None = None
  default_pair: str | None = None
  role: str = "verifier"
  seed: int = 0
  max_input_tokens: int | None = None

  def check(self) -> None:
    """Cheap checks of every field (nothing loaded); raises ValueError."""
    what = f"the {self.role}'s ModelSpec"
    if self.role not in ROLES:
      raise ValueError(f"ModelSpec.role must be 'drafter', 'medium' or "
                       f"'verifier', got {self.role!r}")
    if self.dtype not in ("float32", "bfloat16"):
      raise ValueError(f"{what}: dtype must be 'float32' or 'bfloat16', got "
                       f"{self.dtype!r}")
    if self.checkpoint_format not in CHECKPOINT_FORMATS:
      raise ValueError(f"{what}: checkpoint_format must be one of "
                       f"{', '.join(CHECKPOINT_FORMATS)}, got "
                       f"{self.checkpoint_format!r}")
    if self.preset is not None and self.preset not in models.PRESETS:
      raise ValueError(f"{what}: unknown preset {self.preset!r}; choose one of "
                       f"{', '.join(sorted(models.PRESETS))}")
    if not (self.default_pair or self.checkpoint or self.preset):
      raise ValueError(f"the {self.role} needs a preset, a checkpoint or a "
                       f"default_pair")
    for name, path in (("checkpoint", self.checkpoint),
                       ("tokenizer", self.tokenizer)):
      if path and not str(path).startswith("gs://") and not os.path.exists(
          path):
        raise ValueError(f"{what}: {name} {path!r} does not exist")
    if _bad_int(self.seed, 0, 2**32):
      raise ValueError(f"{what}: seed must be an integer in [0, 2**32), got "
                       f"{self.seed!r}")
    if self.max_input_tokens is not None and _bad_int(
        self.max_input_tokens, 2, 2**31):
      raise ValueError(f"{what}: max_input_tokens must be an integer >= 2 or "
                       f"None, got {self.max_input_tokens!r}")

  def architecture(self):
    """The model object (config only, no parameters read; cheap)."""
    self.check()
    if self.default_pair:
      from specdec_jax.checkpoints import native  # pylint: disable=g-import-not-at-top
      from specdec_jax.eval import default_models  # pylint: disable=g-import-not-at-top
      name = default_models.BENCHMARK_NAMES.get(self.default_pair,
                                                self.default_pair)
      if name not in default_models.TASKS:
        raise ValueError(f"unknown default pair {self.default_pair!r}; "
                         f"available: {', '.join(default_models.PAIRS)}")
      path = os.path.join(default_models.ASSETS, name, self.role,
                          native.CONFIG)
      if not os.path.isfile(path) and self.role == "medium":
        raise ValueError(f"the default pair {name!r} has no medium model "
                         f"({path} is missing; assets built before medium "
                         f"models existed); {default_models.BUILD_HINT}")
      if not os.path.isfile(path):
        raise ValueError(f"the default pair {name!r} is not built ({path} is "
                         f"missing); {default_models.BUILD_HINT}")
      with open(path) as f:
        return models.model_from_config(native.config_from_dict(json.load(f)))
    if self.checkpoint:
      return _checkpoint_architecture(self)
    return models.get_model(self.preset)

  def input_limit(self, model=None) -> int:
    """The maximum input length (see ``max_input_tokens``)."""
    if self.max_input_tokens is not None:
      return int(self.max_input_tokens)
    if self.default_pair:
      from specdec_jax.eval import default_models  # pylint: disable=g-import-not-at-top
      name = default_models.BENCHMARK_NAMES.get(self.default_pair,
                                                self.default_pair)
      return default_models.TASKS[name].max_input_tokens
    model = model or self.architecture()
    return DEFAULT_MAX_INPUT_TOKENS["t5" if model.is_encoder_decoder
                                    else "gemma"]

  def load_tokenizer(self, model=None):
    """The Tokenizer (None without one); reads only the .model file."""
    if self.default_pair:
      from specdec_jax.eval import default_models  # pylint: disable=g-import-not-at-top
      name = default_models.BENCHMARK_NAMES.get(self.default_pair,
                                                self.default_pair)
      path = os.path.join(default_models.ASSETS, name,
                          default_models.TOKENIZER)
      return tokenizer_lib.Tokenizer(_read_bytes(path),
                                     default_models.TASKS[name].family,
                                     extra_ids=0)
    if not self.tokenizer:
      return None
    model = model or self.architecture()
    family = "t5" if model.is_encoder_decoder else "gemma"
    tok = tokenizer_lib.Tokenizer(_read_bytes(self.tokenizer), family)
    tokenizer_lib.check_fits_model(tok, model.vocab_size, self.role)
    return tok

  def load(self):
    """Returns (model, params, tokenizer or None)."""
    self.check()
    if self.default_pair:
      from specdec_jax.eval import default_models  # pylint: disable=g-import-not-at-top
      pair = default_models.load(self.default_pair, dtype=self.dtype)
      level = {"drafter": "small", "medium": "medium",
               "verifier": "large"}[self.role]
      model, params = pair.model(level)
      return model, params, pair.tokenizer
    if self.checkpoint:
      from specdec_jax import checkpoints  # pylint: disable=g-import-not-at-top
      model, params = checkpoints.load(self.checkpoint, model=self.preset,
                                       format=self.checkpoint_format,
                                       dtype=self.dtype)
    else:
      model = models.get_model(self.preset)
      params = model.init_params(jax.random.PRNGKey(self.seed))
      print(f"note: {self.role} '{self.preset}' has RANDOM weights (no "
            f"checkpoint given)", file=sys.stderr)
    return model, params, self.load_tokenizer(model)


def _bad_int(x, lo: int, hi: int) -> bool:
  """True unless x is an int (not bool) in [lo, hi)."""
  return (isinstance(x, bool) or not isinstance(x, (int, np.integer))
          or not lo <= x < hi)


def _checkpoint_architecture(spec: ModelSpec):
  """The model of a checkpoint from its config.json, or from the preset."""
  # pylint: disable=g-import-not-at-top
  from specdec_jax.checkpoints import hf, loader, native
  fmt = spec.checkpoint_format
  if fmt == "auto":
    fmt = loader.detect_format(spec.checkpoint)
  if fmt == "native":
    with open(os.path.join(spec.checkpoint, native.CONFIG)) as f:
      try:
        meta = json.load(f)
      except json.JSONDecodeError as e:
        raise ValueError(f"{spec.checkpoint}/config.json is not valid JSON: "
                         f"{e}") from None
    return models.model_from_config(native.config_from_dict(meta))
  if fmt == "hf":
    return hf.model_from_hf_config(hf.read_config(spec.checkpoint),
                                   spec.checkpoint)[0]
  if spec.preset is None:
    raise ValueError(f"checkpoint {spec.checkpoint!r} ({fmt}) holds no model "
                     f"config: set the {spec.role}'s ModelSpec.preset")
  return models.get_model(spec.preset)


def _read_bytes(path: str) -> bytes:
  if path.startswith("gs://"):
    from etils import epath  # pylint: disable=g-import-not-at-top
    return epath.Path(path).read_bytes()
  if not os.path.isfile(path):
    raise ValueError(f"file not found: {path}")
  with open(path, "rb") as f:
    return f.read()


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
  d_model, q_params, d_tok = drafter.load()
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
