"""What the command line runs, as plain (gin-free) functions.

``specdec_jax.main`` binds these from gin files and flags; they can equally be
called from Python. Every mode reads its inputs, runs on the host's share of
the batch and lets only process 0 write results.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from typing import Any, Iterable, Sequence

import jax
import numpy as np

from specdec_jax import decoding, models
from specdec_jax import tokenizer as tokenizer_lib


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
    checkpoint_format: 'auto', 'native', 'hf', 't5x', 'gemma'.
    dtype: parameter dtype after loading ('bfloat16' or 'float32').
    tokenizer: SentencePiece .model path (None: token ids in and out).
    default_pair: name of a built-in pair ('t5_docstring', ...).
    role: 'drafter' or 'verifier' (with ``default_pair``).
    seed: seed of random weights.
  """

  preset: str | None = None
  checkpoint: str | None = None
  checkpoint_format: str = "auto"
  dtype: str = "float32"
  tokenizer: str | None = None
  default_pair: str | None = None
  role: str = "verifier"
  seed: int = 0

  def load(self):
    """Returns (model, params, tokenizer or None)."""
    if self.role not in ("drafter", "verifier"):
      raise ValueError(f"ModelSpec.role must be 'drafter' or 'verifier', got "
                       f"{self.role!r}")
    if self.default_pair:
      from specdec_jax.eval import default_models  # pylint: disable=g-import-not-at-top
      pair = default_models.load(self.default_pair, dtype=self.dtype)
      if self.role == "drafter":
        return pair.drafter, pair.q_params, pair.tokenizer
      return pair.verifier, pair.p_params, pair.tokenizer
    if self.checkpoint:
      from specdec_jax import checkpoints  # pylint: disable=g-import-not-at-top
      model, params = checkpoints.load(self.checkpoint, model=self.preset,
                                       format=self.checkpoint_format,
                                       dtype=self.dtype)
    elif self.preset:
      model = models.get_model(self.preset)
      params = model.init_params(jax.random.PRNGKey(self.seed))
      print(f"note: {self.role} '{self.preset}' has RANDOM weights (no "
            f"checkpoint given)", file=sys.stderr)
    else:
      raise ValueError(f"the {self.role} needs a preset, a checkpoint or a "
                       f"default_pair")
    tok = None
    if self.tokenizer:
      family = "t5" if model.is_encoder_decoder else "gemma"
      tok = tokenizer_lib.Tokenizer(_read_bytes(self.tokenizer), family)
      tokenizer_lib.check_fits_model(tok, model.vocab_size, self.role)
    return model, params, tok


def _read_bytes(path: str) -> bytes:
  if path.startswith("gs://"):
    from etils import epath  # pylint: disable=g-import-not-at-top
    return epath.Path(path).read_bytes()
  if not os.path.isfile(path):
    raise ValueError(f"file not found: {path}")
  with open(path, "rb") as f:
    return f.read()


def read_requests(path: str | None) -> list[dict[str, Any]]:
  """Reads decode requests from a JSONL / text file, or stdin when None/'-'.

  JSONL lines are objects with ``inputs`` (text) or ``tokens`` (ids) and an
  optional ``id``; other lines are taken as text inputs.
  """
  if path in (None, "-"):
    lines = sys.stdin.read().splitlines()
    where = "stdin"
  else:
    if not os.path.isfile(path):
      raise ValueError(f"input file not found: {path}")
    with open(path, encoding="utf-8") as f:
      lines = f.read().splitlines()
    where = path
  requests = []
  for n, line in enumerate(lines, 1):
    if not line.strip():
      continue
    if path and path.endswith(".jsonl") or line.lstrip().startswith("{"):
      try:
        obj = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f"{where}:{n}: not valid JSON ({e.msg})") from None
      if not isinstance(obj, dict) or not ({"inputs", "tokens"} & set(obj)):
        raise ValueError(f"{where}:{n}: expected an object with 'inputs' "
                         f"(text) or 'tokens' (ids)")
    else:
      obj = {"inputs": line}
    obj.setdefault("id", str(len(requests)))
    requests.append(obj)
  if not requests:
    raise ValueError(f"no requests found in {where}")
  return requests


def _to_ids(req, tok, encdec: bool) -> list[int]:
  if "tokens" in req:
    return [int(t) for t in req["tokens"]]
  if tok is None:
    raise ValueError(f"request {req['id']!r} has text but no tokenizer is "
                     f"configured; set ModelSpec.tokenizer or pass 'tokens'")
  if encdec:
    return tok.encode(req["inputs"], add_eos=True)
  return tok.encode(req["inputs"])


def is_writer() -> bool:
  """Only process 0 writes results on a multi-host run."""
  return jax.process_index() == 0


def run_decode(drafter: ModelSpec, verifier: ModelSpec, method, sampling=None,
               gamma: int = 5, max_new_tokens: int = 64, batch_size: int = 8,
               input_file: str | None = None, output_file: str | None = None,
               seed: int = 0, progress: bool = True) -> list[dict[str, Any]]:
  """Decodes requests and writes one JSONL row per request.

  Args:
    drafter, verifier: ModelSpecs.
    method: a decoding method object (``decoding.make_method``).
    sampling: sampling strategy (default greedy).
    gamma: draft block size.
    max_new_tokens: generation budget per request.
    batch_size: requests per decode call.
    input_file: JSONL / text file of requests; None or '-' reads stdin.
    output_file: JSONL path (None prints rows to stdout).
    seed: sampling seed (each request's id keeps its randomness its own).
    progress: show a progress bar.

  Returns:
    The rows (text, tokens, per-row statistics, latency).
  """
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  requests = read_requests(input_file)
  v_model, p_params, v_tok = verifier.load()
  d_model, q_params, d_tok = (v_model, p_params, v_tok)
  if method.uses_drafter:
    d_model, q_params, d_tok = drafter.load()
    if d_tok is not None and v_tok is not None:
      tokenizer_lib.check_same_vocabulary(d_tok, v_tok)
  tok = v_tok or d_tok
  encdec = v_model.is_encoder_decoder
  rows = []
  bar = tqdm(total=len(requests), disable=not progress, desc="decode",
             file=sys.stderr)
  for start in range(0, len(requests), batch_size):
    chunk = requests[start:start + batch_size]
    ids = [_to_ids(r, tok, encdec) for r in chunk]
    if encdec:
      kw = dict(inputs=ids)
    else:
      bos = getattr(v_model.config, "bos_id", None)
      kw = dict(prompts=[x if (x and x[0] == bos) or bos is None else [bos] + x
                         for x in ids])
    t0 = time.perf_counter()
    out = decoding.generate(
        method, d_model, v_model, q_params, p_params, sampling=sampling,
        gamma=gamma, max_new_tokens=max_new_tokens, seeds=seed,
        request_ids=[start + i for i in range(len(chunk))], **kw)
    dt = time.perf_counter() - t0
    for i, req in enumerate(chunk):
      stats = out.row_stats(i)
      stats["num_tokens"] = stats.pop("tokens")
      toks = out.sequences()[i]
      row = dict(id=req["id"], tokens=toks, **stats, batch_seconds=dt)
      if tok is not None:
        row["text"] = tok.decode(toks)
      rows.append(row)
    bar.update(len(chunk))
  bar.close()
  if is_writer():
    _write_jsonl(rows, output_file)
  return rows


def _write_jsonl(rows: Iterable[dict], path: str | None) -> None:
  if path is None:
    for r in rows:
      print(json.dumps(r))
    return
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    for r in rows:
      f.write(json.dumps(r) + "\n")


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
  """Totals over decode rows: tokens/s, acceptance, block efficiency."""
  total = lambda k: sum(r.get(k, 0) for r in rows)
  tokens = total("num_tokens")
  seconds = sum({r["batch_seconds"] for r in rows}) if rows else 0.0
  div = lambda a, b: a / b if b else float("nan")
  return dict(requests=len(rows), tokens=tokens,
              tokens_per_s=div(tokens, seconds),
              acceptance_rate=div(total("accepted"), total("drafted")),
              block_efficiency=div(tokens, total("verifier_calls")),
              deferral_rate=div(total("deferrals"), tokens))


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
  """

  name: str
  drafter: Any
  verifier: Any
  q_params: Any
  p_params: Any
  tokenizer: tokenizer_lib.Tokenizer
  metrics: tuple[str, ...]
  max_new_tokens: int

  @property
  def is_encoder_decoder(self) -> bool:
    return self.verifier.is_encoder_decoder

  def encode(self, examples) -> dict:
    """Example texts -> ``generate`` keyword arguments (ragged ids)."""
    enc = self.is_encoder_decoder
    rows = [_to_ids({"inputs": e["inputs"], "id": e.get("id")},
                    self.tokenizer, enc) for e in examples]
    return {"inputs": rows} if enc else {"prompts": rows}

  def decode(self, token_rows) -> list[str]:
    return [self.tokenizer.decode(list(map(int, r))) for r in token_rows]


def load_pair(drafter: ModelSpec, verifier: ModelSpec,
              metrics: Sequence[str], max_new_tokens: int,
              name: str | None = None):
  """Loads both models (a built-in default pair as a whole) for evaluation."""
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
                    tuple(metrics), max_new_tokens)


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
  top_p = [1.0 if p is None else p for p in sweep.get("top_p", [None])]
  configs = harness.grid(
      {m: dict(k) for m, k in sweep["methods"].items()},
      temperature=list(sweep.get("temperatures", [0.0])), top_p=top_p,
      gamma=list(sweep.get("gammas", [5])),
      max_new_tokens=sweep.get("max_new_tokens"),
      batch_size=sweep.get("batch_size", 1), seed=sweep.get("seed", 0))
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
