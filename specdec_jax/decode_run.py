"""``specdec_jax decode``: requests in, one JSONL row per request out, streamed.

Order of work (everything that can be wrong is found before a model loads):

1. the settings: method knobs (``method.validate()``), sampling, gamma,
   max_new_tokens, batch_size, seed (``decode_checks.check_settings``);
2. the two ModelSpecs (presets, paths) and their architectures, read from
   configs without the weights; the tokenizer; a hierarchy's levels
   (vocabularies, tokenizers, early-exit depths, the top method);
3. every request (``decode_requests.read_requests``): bad lines are kept
   aside with their file, line and reason; long ones are cut with a warning;
4. the KV-cache memory of the longest batch against the host / device
   memory (``decode_checks.check_memory``);
5. the output: its directory is created and ``decodes.jsonl`` opened and
   locked (an exclusive ``flock``: a second decode writing the same file
   fails at once instead of overwriting it); rows already there are kept.

Then the models load and the good requests not yet in the output decode in
batches; each batch's rows are appended the moment it finishes (one
``write`` + ``fsync`` per row, the eval harness's ``ResultsFile``). A run
that is killed loses at most the batch in flight; rerunning the same command
skips the finished requests (rows are keyed by request content, see
``decode_requests.row_key``: a deleted or edited line never pairs a request
with another's row; rows of requests no longer in the input are dropped) and
cuts off a
torn last line, so the output ends with no lost or duplicated rows. A rerun
with different settings into the same file is refused: every row carries
its ``settings`` string. Bad requests are reported at the end (one line
each, and the command exits with status 2) after the good rows are written.

Each row's randomness depends only on (seed, request id, request), never on
its batch or position: its request id is the CRC-32 of its JSON ``id``, or
of its content key when it has none (``eval.harness.request_id``), so a
resumed run writes the rows an uninterrupted run would have.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from typing import Any

import jax

from specdec_jax import decode_requests, decoding, hierarchy_spec
from specdec_jax import model_spec
from specdec_jax.decode_checks import check_memory, check_settings
from specdec_jax.eval import harness


@dataclasses.dataclass
class DecodeReport:
  """What :func:`run_decode` did.

  Attributes:
    rows: the rows of every good request, in input order (rows found in the
      output from an earlier run included).
    new_rows: the rows decoded (and written) by this run.
    resumed: good requests already in the output (skipped).
    failed: the bad requests (``decode_requests.RequestError``).
    seconds: wall time of the decode calls of this run.
    output: the output file (None: stdout).
    compile_seconds: the part of ``seconds`` spent tracing and compiling
      (or loading compiled programs from the persistent cache).
  """

  rows: list[dict[str, Any]]
  new_rows: list[dict[str, Any]]
  resumed: int
  failed: list[decode_requests.RequestError]
  seconds: float
  output: str | None
  compile_seconds: float = 0.0

  @property
  def written(self) -> int:
    return len(self.new_rows)

  def summary(self) -> dict[str, Any]:
    """Counts and totals over the rows written by this run; tokens_per_s
    is over decode_s, the decode time without compile_s (tracing and
    compiling, or loading from the persistent compilation cache)."""
    total = lambda k: sum(r.get(k, 0) for r in self.new_rows)
    div = lambda a, b: a / b if b else float("nan")
    tokens = total("num_tokens")
    decode_s = max(self.seconds - self.compile_seconds, 0.0)
    return dict(requests=len(self.rows) + len(self.failed),
                written=self.written, resumed=self.resumed,
                failed=len(self.failed), tokens=tokens,
                compile_s=self.compile_seconds, decode_s=decode_s,
                tokens_per_s=div(tokens, decode_s),
                acceptance_rate=div(total("accepted"), total("drafted")),
                block_efficiency=div(tokens, total("verifier_calls")),
                deferral_rate=div(total("deferrals"), tokens))

  def raise_for_failures(self) -> None:
    """Raises decode_requests.RequestErrors if any request was bad."""
    if self.failed:
      n = len(self.rows) + len(self.failed)
      if self.output:
        note = (f"the other {len(self.rows)} are in {self.output}; fix them "
                f"and rerun the same command: finished rows are kept and "
                f"only the missing requests are decoded")
      else:
        note = f"the other {len(self.rows)} were printed; fix them and rerun"
      raise decode_requests.RequestErrors(
          self.failed, f"{len(self.failed)} of {n} requests were invalid and "
          f"not decoded ({note})")


def settings_key(method, sampling, gamma, max_new_tokens, seed, drafter,
                 verifier, limit: int) -> str:
  """What decides a row's tokens (batch size does not), as one string."""
  d = repr(drafter) if method.uses_drafter else "-"
  return (f"method={method!r}|sampling={sampling!r}|gamma={gamma}|"
          f"max_new_tokens={max_new_tokens}|seed={seed}|drafter={d}|"
          f"verifier={verifier!r}|max_input_tokens={limit}")


def _open_output(path: str):
  """Opens and locks the output (before any model loads)."""
  path = os.path.abspath(path)
  parent = os.path.dirname(path)
  probe = parent
  while not os.path.exists(probe):
    probe = os.path.dirname(probe)
  if not os.path.isdir(probe):
    raise ValueError(f"cannot write {path}: {probe} is a file, not a "
                     f"directory; choose another OUTPUT_DIR")
  if os.path.isdir(path):
    raise ValueError(f"cannot write {path}: it is a directory")
  results = harness.ResultsFile(path)
  try:
    return results.__enter__()
  except RuntimeError as e:
    raise ValueError(f"{path} is being written by another decode (it is "
                     f"locked); wait for it to finish or choose another "
                     f"OUTPUT_DIR") from e
  except OSError as e:
    raise ValueError(f"cannot write {path}: {e.strerror or e} (check the "
                     f"directory's permissions, or choose another "
                     f"OUTPUT_DIR)") from None


def _check_resumable(results, settings: str) -> None:
  other = [r for r in results.rows if r.get("settings") != settings]
  if other:
    results.__exit__(None, None, None)
    old = str(other[0].get("settings"))
    diff = [f"{a.split('=', 1)[0]}" for a, b in zip(old.split("|"),
                                                    settings.split("|"))
            if a != b]
    raise ValueError(
        f"{results.path} holds {len(other)} row(s) decoded with other "
        f"settings (differing: {', '.join(diff) or 'all'}); a decode resumes "
        f"only with the same settings: choose another OUTPUT_DIR or delete "
        f"the file")


def _warn_cut(requests, where: str, limit: int) -> None:
  for r in requests:
    if r.truncated:
      print(f"specdec_jax: warning: {where}:{r.line} (request {r.id!r}) has "
            f"{r.input_tokens} input tokens, more than the verifier's "
            f"max_input_tokens ({limit}); it is cut to {limit}",
            file=sys.stderr)


def run_decode(drafter, verifier, method, sampling=None, gamma: int = 5,
               max_new_tokens: int = 64, batch_size: int = 8,
               input_file: str | None = None, output_file: str | None = None,
               seed: int = 0, progress: bool = True,
               tree=None, hierarchy=None) -> DecodeReport:
  """Decodes requests into a JSONL file, streamed and resumable.

  Args:
    drafter, verifier: ``runs.ModelSpec``s.
    method: a decoding method object (``decoding.make_method``).
    sampling: sampling strategy (default greedy).
    gamma: draft block size.
    max_new_tokens: generation budget per request.
    batch_size: requests per decode call (does not change any row).
    input_file: JSONL / text file of requests; None or '-' reads stdin.
    output_file: JSONL path, appended to and resumed (None: rows go to
      stdout as they finish).
    seed: sampling seed (each request's id keeps its randomness its own).
    progress: show a progress bar.
    tree: optional ``decoding.Tree``: tree verification (gamma ignored).
    hierarchy: optional ``hierarchy_spec.HierarchySpec``: hierarchical
      speculative decoding with its drafter levels under ``verifier``
      (``drafter`` and gamma ignored; ``method`` verifies at the top).

  Returns:
    A DecodeReport (see the module docstring for the order of checks).
  """
  sampling = decoding.Greedy() if sampling is None else sampling
  if tree is not None and hierarchy is not None:
    raise ValueError("decode takes a tree (run.tree) or a hierarchy "
                     "(run.hierarchy), not both; include one of "
                     "gin/trees/*.gin and gin/hierarchies/*.gin")
  check_settings(method, sampling, gamma, max_new_tokens, batch_size, seed)
  v_model, d_model, vocab = model_spec.vocab_of(
      drafter, verifier, method.uses_drafter and hierarchy is None)
  runs_models, shared = [v_model, d_model], []
  if hierarchy is not None:
    archs = hierarchy.check(method, v_model, vocab.tokenizer)
    runs_models += [m for m, lv in zip(archs, hierarchy.drafters)
                    if not _is_exit(lv)]
    shared = [m for m, lv in zip(archs, hierarchy.drafters) if _is_exit(lv)]
    gamma_slack = hierarchy.slack()
  else:
    gamma_slack = gamma if tree is None else tree.topology.num_nodes + 1
  where = "stdin" if input_file in (None, "-") else input_file
  good, failed = decode_requests.read_requests(input_file, vocab)
  _warn_cut(good, where, vocab.max_input_tokens)
  key = "inputs" if vocab.encoder_decoder else "prompts"
  width = harness.padded_width([r.ids for r in good]) if good else 1
  check_memory([m for m in runs_models if m is not None],
               min(batch_size, max(len(good), 1)),
               1 if vocab.encoder_decoder else width,
               width if vocab.encoder_decoder else 1, max_new_tokens,
               gamma_slack, cache_only=shared)
  settings = settings_key(method, sampling, gamma, max_new_tokens, seed,
                          drafter if hierarchy is None else None, verifier,
                          vocab.max_input_tokens)
  if tree is not None:
    settings += f"|tree={tree!r}"
  if hierarchy is not None:
    settings += f"|hierarchy={hierarchy!r}"
  results = None
  if output_file is not None and is_writer():
    results = _open_output(output_file)
    _check_resumable(results, settings)
  try:
    done = _resume(results, good) if results else {}
    todo = [r for r in good if r.key not in done]
    new = _decode(drafter, verifier, method, sampling, gamma, max_new_tokens,
                  batch_size, seed, todo, key, width, settings, results,
                  progress, tree, hierarchy) if todo else ({}, (0.0, 0.0))
  finally:
    if results is not None:
      results.__exit__(None, None, None)
  rows_new, (seconds, compile_s) = new
  rows = [rows_new[r.key] if r.key in rows_new else done[r.key] for r in good]
  return DecodeReport(rows=rows, new_rows=[rows_new[r.key] for r in todo],
                      resumed=len(good) - len(todo), failed=failed,
                      seconds=seconds, output=output_file,
                      compile_seconds=compile_s)


def _resume(results, good) -> dict:
  """{key: row} of the finished rows of ``good``, matched by content key.

  Rows of requests no longer in the input (a deleted or edited line) are
  dropped from the file, and a kept row takes its request's current id and
  line, so the file always holds one row per current request.
  """
  by_key = {r["key"]: r for r in results.rows}
  done = {}
  for req in good:
    row = by_key.get(req.key)
    if row is not None:
      done[req.key] = dict(row, id=req.id, line=req.line)
  if [done.get(r["key"]) for r in results.rows] != results.rows:
    results.replace_rows([done[r.key] for r in good if r.key in done])
  return done


class CompileClock:
  """Seconds spent tracing, lowering and compiling (or loading compiled
  programs from the persistent cache) while it is entered.

  Listens to JAX's compile events (``jax.monitoring`` time spans of the
  jaxpr trace, the MLIR lowering and the backend compile) and sums the
  union of their spans, so nested traces count once.
  """

  EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
            "/jax/core/compile/jaxpr_to_mlir_module_duration",
            "/jax/core/compile/backend_compile_duration")

  def __init__(self):
    self.spans: list[tuple[float, float]] = []

  def _listen(self, event, start, end, **kwargs):
    del kwargs
    if event in self.EVENTS:
      self.spans.append((start, end))

  def __enter__(self) -> "CompileClock":
    jax.monitoring.register_event_time_span_listener(self._listen)
    return self

  def __exit__(self, *exc) -> None:
    jax.monitoring.unregister_event_time_span_listener(self._listen)

  @property
  def seconds(self) -> float:
    total, end = 0.0, -math.inf
    for a, b in sorted(self.spans):
      if b > end:
        total += b - max(a, end)
        end = b
    return total


def is_writer() -> bool:
  """Only process 0 writes results on a multi-host run."""
  return jax.process_index() == 0


def _is_exit(level) -> bool:
  return isinstance(level, hierarchy_spec.EarlyExit)


def _decode(drafter, verifier, method, sampling, gamma, max_new_tokens,
            batch_size, seed, todo, key, width, settings, results, progress,
            tree=None, hierarchy=None):
  """Loads the models and decodes ``todo``; returns ({key: row}, (seconds,
  compile seconds))."""
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  v_model, p_params, v_tok = verifier.load()
  d_model, q_params, d_tok = v_model, p_params, v_tok
  levels = None
  if hierarchy is not None:
    levels = hierarchy.load(v_model, p_params)
  elif method.uses_drafter:
    d_model, q_params, d_tok = drafter.load(v_model)
  tok = v_tok or d_tok

  def generate(chunk):
    kw = dict(sampling=sampling, max_new_tokens=max_new_tokens, seeds=seed,
              request_ids=[harness.request_id(r.seed_key) for r in chunk],
              pad_to=width, **{key: [list(r.ids) for r in chunk]})
    if levels is not None:
      return decoding.generate_hierarchy(
          levels, hierarchy.buffers, method=method,
          lenient=dict(hierarchy.lenient), **kw)
    return decoding.generate(method, d_model, v_model, q_params, p_params,
                             gamma=gamma, tree=tree, **kw)

  rows, seconds, compile_s = {}, 0.0, 0.0
  bar = tqdm(total=len(todo), disable=not progress, desc="decode",
             file=sys.stderr)
  for start in range(0, len(todo), batch_size):
    chunk = todo[start:start + batch_size]
    t0 = time.perf_counter()
    with CompileClock() as clock:
      out = generate(chunk)
    dt = time.perf_counter() - t0
    seconds += dt
    compile_s += min(clock.seconds, dt)
    seqs = out.sequences()
    for i, req in enumerate(chunk):
      stats = out.row_stats(i)
      stats["num_tokens"] = stats.pop("tokens")
      if levels is not None:  # per level, cheapest first (verifier last)
        stats.update(level_calls=out.calls[i].tolist(),
                     level_drafted=out.level_drafted[i].tolist(),
                     level_accepted=out.level_accepted[i].tolist())
      row = dict(key=req.key, id=req.id, line=req.line, tokens=seqs[i],
                 **stats, input_tokens=req.input_tokens,
                 input_truncated=req.truncated, batch_seconds=dt,
                 settings=settings)
      if tok is not None:
        row["text"] = tok.decode(seqs[i])
      if results is not None:
        results.append(row)
      elif is_writer():  # stdout: no resume, so no key / settings
        print(json.dumps({k: v for k, v in row.items()
                          if k not in ("key", "settings")}), flush=True)
      rows[req.key] = row
    bar.update(len(chunk))
  bar.close()
  return rows, (seconds, compile_s)


__all__ = ["DecodeReport", "run_decode", "settings_key"]
