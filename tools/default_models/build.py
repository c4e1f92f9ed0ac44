"""Builds the default model families: 3 sizes x 2 tasks, then the report.

Reproduces ``specdec_jax/assets/default_models`` from this machine's CPython
standard library and installed pip packages with fixed seeds
(docs/default_models.md):

  python -m tools.default_models.build \\
      --workdir /work/dm_work --out /work/dm_out      # hours on 2 cores
  python -m tools.default_models.build --smoke \\
      --out /tmp/dm --workdir /tmp/dm_work            # the pipeline, minutes

Stages, per family (each one resumable and skipped once done; training
state is checkpointed to ``--workdir/<task>/<stage>`` at every evaluation):

  tokenizer        SentencePiece on the task's training split
  large_pretrain   the large model on plain text (``pretraining.py``:
                   training-split stdlib files + pip packages' text; T5: the
                   text's docstring examples, see ``pretrain_data``)
  large            ... fine-tuned on the task -> ``<out>/<task>/verifier``
  self_teacher     (plan.SELF_DISTILL_TASKS only) the teacher stage's rows
                   of the fine-tuned large, which that task keeps in
                   ``<workdir>/<task>/large/model``
  large_distill    (the same tasks) the fine-tuned large distilled from
                   self_teacher's rows (its own outputs + the ground truth):
                   a born-again round -> ``<out>/<task>/verifier``
  teacher          the shipped large model's greedy and sampled (T=1)
                   outputs on the training and validation inputs, greedy
                   outputs on <= 8,000 more task inputs from the pretraining
                   files (and on plan.MORE_INPUTS further ones: split
                   'more'), and its top-k log-probabilities along them and
                   the ground truth
  medium_pretrain  the medium model (~3.6x cheaper than the large) on plain
                   text
  medium           ... distilled (KL to the teacher + data loss), then a
                   second round on its own greedy outputs scored by the
                   teacher (on-policy) -> ``<out>/<task>/medium``; the
                   t5_codegen medium: one round, on the teacher's rows plus
                   its greedy rows on 20,000 more inputs (plan.MORE_INPUTS)
  small_pretrain   the small model on plain text
  small            ... distilled the same way -> ``<out>/<task>/drafter``
  eval             test split: held-out loss, greedy quality, repetition,
                   SpecDecode acceptance, costs; a fixed slice for the tests

Order: both families' large models first (``--until large`` stops there, so
they can be checked), then teachers and drafters, then the evaluation;
``metadata.json`` and the Markdown report are written from the results.

The training data come from this machine's corpus; ``--export_data DIR``
writes them into a portable bundle and ``--data DIR`` runs the training
stages from it on another machine (``bundle.py``; eval and
metadata stay where the corpus is). ``--data OLD --export_data NEW`` writes
OLD plus the example splits the plan now wants and OLD lacks ('more', see
``plan.MORE_INPUTS``), drawn from this machine's corpus.

Several processes may share a workdir: each stage runs under a lock
(``stage_lock.py``), so a process that reaches a stage another one is
running waits for it and then skips it. On 2 cores, e.g.: one process per
family (``--pairs``) plus one with ``--only medium_pretrain,small_pretrain``
per family; then once more without ``--pairs`` for the metadata.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import platform
import shutil
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import decoding
from specdec_jax import tokenizer as tokenizer_lib
from specdec_jax.checkpoints import native
from specdec_jax.families import corpus as corpus_lib
from specdec_jax.families import loader as dm
from specdec_jax.models import model_from_config
from tools.default_models import bundle as bundle_lib
from tools.default_models import distill as distill_lib
from tools.default_models import family_eval as dme
from tools.default_models import plan
from tools.default_models import pretraining as pretrain_lib
from tools.default_models import train as train_lib
from tools.default_models.stage_lock import stage_lock

# How the recorded commands start (run from the repository root).
COMMAND = "python -m tools.default_models.build "

STAGES = ("large_pretrain", "large", "self_teacher", "large_distill",
          "teacher", "medium_pretrain", "medium", "small_pretrain", "small",
          "eval")
SELF_STAGES = ("self_teacher", "large_distill")  # self-distilling tasks only


def self_distills(task: str) -> bool:
  """Whether ``task``'s shipped large is its large_distill stage's result."""
  return task in plan.SELF_DISTILL_TASKS


def finetuned_dir(args, task: str) -> str:
  """Where the large stage saves its fine-tuned model: the shipped
  verifier, or, for a self-distilling task, ``<workdir>/<task>/large/model``
  (self_teacher's model; its large_distill stage writes the verifier)."""
  if self_distills(task):
    return os.path.join(args.workdir, task, "large", "model")
  return os.path.join(args.out, task, dm.LEVEL_DIRS["large"])



def log(msg: str) -> None:
  print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Progress:
  """Appends one JSON line per finished stage to ``<workdir>/progress.jsonl``."""

  def __init__(self, workdir: str):
    self.path = os.path.join(workdir, "progress.jsonl")
    os.makedirs(workdir, exist_ok=True)

  def add(self, **row) -> None:
    row = dict(time=time.strftime("%Y-%m-%d %H:%M:%S"), **row)
    with open(self.path, "a") as f:
      f.write(json.dumps(row) + "\n")


# -------------------------------------------------------------------- data


@dataclasses.dataclass
class Family:
  """Everything one task's stages share (built lazily)."""

  task: str
  spec: dm.TaskSpec
  tok: tokenizer_lib.Tokenizer
  train_rows: list
  val_rows: list
  examples: dict
  pre: pretrain_lib.PretrainCorpus | None = None
  # {with prefix-LM pairs: items} (pretrain_data's cache) and the batch maker
  pretrain_items: dict = dataclasses.field(default_factory=dict)
  pretrain_make: object | None = None
  # --data: the bundle's pretraining data (bundle.load_task)
  # and the record of the text it came from (else None: read the corpus)
  bundle: dict | None = None
  pre_record: dict | None = None

  def pretraining_record(self, max_bytes: int) -> dict:
    """What the pretraining text is (files, hash, budget), for the reports."""
    if self.pre_record is not None:
      return self.pre_record
    return _pretraining_meta(self.pre, max_bytes)


def build_tokenizer(task: str, corpus, out_dir: str, force: bool):
  """Trains (or reuses) the task's SentencePiece model on its train split."""
  spec = dm.TASKS[task]
  path = os.path.join(out_dir, task, dm.TOKENIZER)
  if os.path.isfile(path) and not force:
    log(f"{task}: reusing tokenizer {path}")
    return tokenizer_lib.Tokenizer(path, spec.family, extra_ids=0)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  train = corpus.examples[task]["train"]
  texts = [e["inputs"] for e in train] + [e["targets"] for e in train]
  t = time.perf_counter()
  tok = tokenizer_lib.train(texts, spec.vocab_size, spec.family, path=path,
                            extra_ids=0, **dm.SPM_OPTIONS)
  log(f"{task}: tokenizer with {tok.vocab_size} ids in "
      f"{time.perf_counter() - t:.1f}s")
  return tok


def pretrain_data(fam: Family, corpus, workdir: str, level: str):
  """(items, make_batch) of ``level``'s pretraining stream (cached).

  Gemma: windows of ``plan.LM_WINDOW + 1`` ids of the concatenated
  documents (BOS doc EOS ...). T5: the pretraining files' task examples,
  for the sizes in ``plan.PREFIX_LM_LEVELS`` plus as many prefix-LM pairs
  (``plan.PREFIX_LM[task]``: input ids -> the next target ids) cut from the
  concatenated documents.
  """
  prefix_lm = uses_prefix_lm(fam, level)
  if prefix_lm in fam.pretrain_items:
    return fam.pretrain_items[prefix_lm], fam.pretrain_make
  if fam.bundle is not None:  # --data: tokenized on the exporting machine
    if fam.spec.family == "gemma":
      items, make = lm_windows(fam.bundle["stream"])
    else:
      items = fam.bundle[prefix_lm]
      make = dme.batch_maker(fam.spec, fam.tok.eos_id)
    fam.pretrain_items[prefix_lm], fam.pretrain_make = items, make
    return items, make
  pre = fam.pre
  stream = pretrain_stream(fam, workdir)
  if fam.spec.family == "gemma":
    items, make = lm_windows(stream)
  else:
    exs = pretrain_lib.task_examples(
        pre, fam.task, pretrain_lib.held_out_inputs(corpus))
    items = dme.tokenize(fam.tok, fam.spec, exs)
    if prefix_lm:
      n_in, n_out = plan.PREFIX_LM[fam.task]
      step = n_in + n_out
      starts = np.linspace(0, len(stream) - step - 1,
                           num=len(items)).astype(np.int64)
      items += [(list(stream[s:s + n_in]) + [fam.tok.eos_id],
                 list(stream[s + n_in:s + step])) for s in starts]
    make = dme.batch_maker(fam.spec, fam.tok.eos_id)
  fam.pretrain_items[prefix_lm], fam.pretrain_make = items, make
  log(f"{fam.task}: {len(items):,} pretraining items for the {level} model"
      + (" (with prefix-LM pairs)" if prefix_lm else ""))
  return items, make


def uses_prefix_lm(fam: Family, level: str) -> bool:
  """True if ``level``'s T5 pretraining mixes in prefix-LM pairs."""
  return (fam.spec.family != "gemma" and
          level in plan.PREFIX_LM_LEVELS.get(fam.task, ()))


def pretrain_stream(fam: Family, workdir: str) -> np.ndarray:
  """The pretraining documents as one int32 id stream (cached in
  ``<workdir>/<task>/pretrain_tokens.npz``): BOS doc EOS ... (T5 has no
  BOS: documents end with EOS)."""
  pre = fam.pre
  path = os.path.join(workdir, fam.task, "pretrain_tokens.npz")
  if os.path.isfile(path):
    with np.load(path) as f:
      stream, key = f["stream"], str(f["files_hash"])
  if not os.path.isfile(path) or key != pre.files_hash:
    t = time.perf_counter()
    ids, bos = [], [] if fam.tok.bos_id is None else [fam.tok.bos_id]
    for d in pre.documents:
      ids += bos + fam.tok.encode(d.text, add_bos=False) + [fam.tok.eos_id]
    stream = np.asarray(ids, np.int16)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    np.savez(path + ".tmp.npz", stream=stream, files_hash=pre.files_hash)
    os.replace(path + ".tmp.npz", path)
    log(f"{fam.task}: tokenized pretraining text: {len(stream):,} ids in "
        f"{time.perf_counter() - t:.0f}s")
  return stream.astype(np.int32)


def lm_windows(stream: np.ndarray):
  """(window indices, make_batch) of consecutive ``plan.LM_WINDOW + 1``-id
  windows of ``stream`` (Gemma pretraining)."""
  w = plan.LM_WINDOW + 1

  def make(starts):
    x = np.stack([stream[s * w:(s + 1) * w] for s in starts])
    return dict(decoder_inputs=x[:, :-1], targets=x[:, 1:],
                weights=np.ones((len(starts), w - 1), np.float32))
  return list(range(len(stream) // w)), make


# ---------------------------------------------------------------- training


def _train_seconds(history) -> float:
  """Sum over resumed segments of each segment's last elapsed_s."""
  rows = [h for h in history if "elapsed_s" in h]
  return sum(a["elapsed_s"] for a, b in zip(rows, rows[1:] + [None])
             if b is None or b["elapsed_s"] < a["elapsed_s"])


def run_training(name: str, model, params, cfg, items, make, batch_size,
                 eval_batches, workdir: str,
                 on_eval=None) -> tuple[dict, dict]:
  """Trains from ``params`` (or resumes); returns (best params, report)."""
  length = (lambda r: len(r[0]) + len(r[1])) if isinstance(
      items[0], tuple) else (lambda r: 0)
  if isinstance(items[0], distill_lib.Row):
    length = lambda r: len(r.inputs) + len(r.targets)
  stream = lambda start: train_lib.bucketed_stream(
      items, make, batch_size, length, seed=plan.DATA_SEED + cfg.seed,
      start_step=start)
  log(f"{name}: {model.num_params():,} parameters, {cfg.steps} steps of "
      f"{batch_size}, {len(items):,} items")
  result = train_lib.train(model, params, cfg, stream, eval_batches,
                           workdir=workdir,
                           log=lambda s: log(f"{name}: {s}"), on_eval=on_eval)
  hist = result.history
  rates = [h["tokens_per_s"] for h in hist if "tokens_per_s" in h]
  ran = max((h["step"] for h in hist), default=0)
  report = dict(steps=cfg.steps, steps_run=ran, batch_size=batch_size,
                train_config=dataclasses.asdict(cfg),
                best_step=result.best_step,
                best_eval_objective=result.best_eval_loss,
                eval_losses={h["step"]: h["eval_loss"] for h in hist
                             if "eval_loss" in h},
                final_train_loss=next((h["loss"] for h in reversed(hist)
                                       if "loss" in h), None),
                train_seconds=round(_train_seconds(hist), 1),
                tokens_per_s=round(float(np.median(rates)), 1)
                if rates else None)
  return result.params, report


def stage_done(workdir: str):
  path = os.path.join(workdir, "done.json")
  if os.path.isfile(path):
    with open(path) as f:
      return json.load(f)
  return None


def _write_json(path: str, obj, indent: int | None = 1) -> None:
  """Writes ``obj`` as JSON atomically (a killed run leaves no torn file)."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path + ".tmp", "w") as f:
    json.dump(obj, f, indent=indent)
  os.replace(path + ".tmp", path)


def require_done(fam, args, stage: str, *needs: str) -> None:
  """Raises RuntimeError naming the first of ``needs`` not finished."""
  for need in needs:
    if stage_done(os.path.join(args.workdir, fam.task, need)) is None:
      raise RuntimeError(
          f"{fam.task}/{stage} needs the finished '{need}' stage in "
          f"{args.workdir}; run it first (it is in the default order, or "
          f"--only {need})")


def ran_on() -> str:
  """This machine, as a stage's done.json records it ('ran_on')."""
  dev = jax.devices()[0]
  return (f"{platform.node()} ({platform.machine()}, {os.cpu_count()} cpus, "
          f"{jax.default_backend()}: {dev.device_kind}, jax "
          f"{jax.__version__})")


def mark_done(workdir: str, report: dict) -> None:
  report.setdefault("ran_on", ran_on())
  _write_json(os.path.join(workdir, "done.json"), report)


def save_model(out: str, model, params) -> dict:
  native.save(out, model, params, dtype="bfloat16")
  return dict(config=native.config_to_dict(model.config),
              params=model.num_params(),
              checkpoint_mb=round(os.path.getsize(
                  os.path.join(out, native.PARAMS)) / 2**20, 3))


def load_saved(out: str):
  """A saved (bfloat16) checkpoint as float32 compute: the shipped model."""
  return native.load(out, dtype="float32")


def val_batches(fam: Family, rows=None):
  make = dme.batch_maker(fam.spec, fam.tok.eos_id, 0.0)
  rows = sorted(rows or fam.val_rows, key=lambda r: len(r[0]) + len(r[1]))
  return [make(rows[i:i + 32]) for i in range(0, len(rows), 32)]


def stage_train(fam: Family, stage: str, args, corpus,
                progress: Progress) -> dict:
  """large_pretrain / large / {medium,small}_pretrain: cross-entropy stages."""
  wd = os.path.join(args.workdir, fam.task, stage)
  done = stage_done(wd)
  if done and not args.force:
    return done
  st = plan.stage(fam.task, stage, args.smoke, args.smoke_steps)
  if stage == "large":
    require_done(fam, args, stage, "large_pretrain")
  t0 = time.perf_counter()
  if stage == "large":  # fine-tune the pretrained large model
    model = model_from_config(plan.arch(fam.task, "large", fam.tok))
    params = _load_npz_params(os.path.join(
        args.workdir, fam.task, "large_pretrain", "final_params.npz"), model)
    items = fam.train_rows
    make = dme.batch_maker(fam.spec, fam.tok.eos_id, plan.PROMPT_WEIGHT)
  else:
    level = stage.split("_")[0]
    model = model_from_config(plan.arch(fam.task, level, fam.tok))
    params = train_lib.init_params(model, st.config.seed)
    items, make = pretrain_data(fam, corpus, args.workdir, level)
  if st.decoder_dropout:
    make = functools.partial(_with_decoder_dropout, make, st.decoder_dropout,
                             fam.tok.unk_id, st.config.seed)
  keep = "last" if stage.endswith("_pretrain") else st.keep
  on_eval = None
  if keep == "metric_within":  # every evaluated step is a candidate
    os.makedirs(os.path.join(wd, EVAL_PARAMS), exist_ok=True)
    on_eval = lambda step, p, _: _save_npz_params(
        os.path.join(wd, EVAL_PARAMS, f"step_{step}.npz"), p)
  best, report = run_training(f"{fam.task}/{stage}", model, params,
                              st.config, items, make, st.batch_size,
                              val_batches(fam), wd, on_eval=on_eval)
  report["kept_step"] = report["best_step"]
  if keep == "metric_within":
    steps = steps_within(report["eval_losses"], st.loss_tolerance)
    log(f"{fam.task}/{stage}: steps within {st.loss_tolerance} of the best "
        f"validation loss: {steps}")
    cands = {s: _load_npz_params(os.path.join(
        wd, EVAL_PARAMS, f"step_{s}.npz"), model) for s in steps}
    best, report["kept_step"], report["candidates"] = choose_by_metric(
        fam, model, cands, wd)
  elif keep != "best":  # pretraining: still improving; see plan.Stage.keep
    state = train_lib.restore_state(wd, train_lib.init_state(
        params, st.config))
    if state is not None and int(state[0].step) != report["best_step"]:
      last, last_step = jax.device_get(state[0].params), int(state[0].step)
      if keep == "last":
        best, report["kept_step"] = last, last_step
      else:
        best, report["kept_step"], report["candidates"] = choose_by_metric(
            fam, model, {report["best_step"]: best, last_step: last}, wd)
  if stage.endswith("_pretrain"):
    _save_npz_params(os.path.join(wd, "final_params.npz"), best)
    if stage == "large_pretrain":  # the text the family read (metadata)
      report["pretraining"] = fam.pretraining_record(pretrain_bytes(
          args, fam.task))
  else:
    out = finetuned_dir(args, fam.task)
    report.update(save_model(out, model, best))
    report["check"] = check_large(fam, out)
  report["wall_seconds"] = round(time.perf_counter() - t0, 1)
  mark_done(wd, report)
  progress.add(task=fam.task, stage=stage, **{
      k: report[k] for k in ("best_eval_objective", "train_seconds",
                             "tokens_per_s", "wall_seconds")})
  return report


def _with_decoder_dropout(make, rate: float, token_id: int, seed: int,
                          rows):
  """``make(rows)`` with word dropout on the decoder inputs (see
  ``train.decoder_token_dropout``)."""
  return train_lib.decoder_token_dropout(make(rows), rate, token_id, seed)


EVAL_PARAMS = "eval_params"  # keep='metric_within': <wd>/eval_params/step_N.npz


def steps_within(eval_losses: dict, tolerance: float) -> list[int]:
  """Evaluated steps whose loss is within ``tolerance`` of the lowest,
  lowest loss first (earlier step on a tie).

  Args:
    eval_losses: {step: validation loss}.
    tolerance: nats per token above the lowest loss.
  """
  low = min(eval_losses.values())
  return sorted((s for s, v in eval_losses.items() if v <= low + tolerance),
                key=lambda s: (eval_losses[s], s))


def choose_by_metric(fam: Family, model, candidates: dict, wd: str,
                     examples=None):
  """(params, step, checks) of the candidate with the best greedy
  validation metric (:func:`check_large` of each, saved as shipped; the
  first candidate, the best-loss one, wins a tie).

  Args:
    candidates: {step: params}, best-loss step first.
    examples: the validation examples checked (default: check_large's).
  """
  metric = fam.spec.metrics[0]
  checks, best_step = {}, None
  for step, params in candidates.items():
    out = os.path.join(wd, f"candidate_{step}")
    save_model(out, model, params)
    checks[str(step)] = check_large(fam, out, examples)
    if best_step is None or checks[str(step)][metric] > checks[str(
        best_step)][metric]:
      best_step = step
  log(f"{fam.task}/large: keeping step {best_step} ({metric} "
      + ", ".join(f"{s}: {c[metric]}" for s, c in checks.items()) + ")")
  return candidates[best_step], best_step, checks


def check_large(fam: Family, out: str, examples=None) -> dict:
  """Greedy quality of the saved large model on validation examples (a
  quick look before the drafters are distilled from it).

  Args:
    examples: the examples decoded (default: the first
      ``plan.CHECK_EXAMPLES`` of the validation split).
  """
  model, params = load_saved(out)
  pair = dm.DefaultPair(fam.task, model, model, params, params, fam.tok,
                        fam.spec.metrics, fam.spec.max_new_tokens,
                        model.is_encoder_decoder, fam.spec)
  exs = examples if examples is not None else (
      fam.examples["validation"][:plan.CHECK_EXAMPLES])
  preds, stats = dme.decode(pair, decoding.make_method("target_only"), exs,
                            verifier="large")
  row = dme.quality(pair, exs, preds)
  row["mean_tokens"] = round(stats["tokens"] / len(exs), 2)
  row["examples"] = len(exs)
  log(f"{fam.task}/large: validation check {row}")
  for e, p in list(zip(exs, preds))[:3]:
    log(f"{fam.task}/large: target {e['targets']!r} -> {p!r}")
  return row


def _save_npz_params(path: str, params) -> None:
  """A pretraining stage's result, rounded to bfloat16 (:func:`to_bf16`)."""
  train_lib._save_tree(path, to_bf16(params))  # pylint: disable=protected-access


def _load_npz_params(path: str, model):
  """The next stage's float32 start: the saved bfloat16-rounded values."""
  like = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype),
                      model.param_shapes())
  params = train_lib._load_tree(path, like)[0]  # pylint: disable=protected-access
  return to_bf16(params)


def to_bf16(params):
  """``params`` rounded to bfloat16 and back to their dtype.

  Every stage starts from its input stage's parameters rounded like this
  (the shipped checkpoints are bfloat16 too), so a build restored from a
  committed snapshot (``snapshot.py``, which stores
  bfloat16) continues exactly as an uninterrupted one.
  """
  return jax.tree.map(
      lambda x: np.asarray(np.asarray(x).astype(jnp.bfloat16)).astype(
          np.asarray(x).dtype), params)


# -------------------------------------------------------------- distillation


def _pass_path(wd: str, split: str, name: str) -> str:
  return os.path.join(wd, f"{split}_{name}_outputs.json")


def _load_pass(wd: str, split: str, name: str, n: int):
  """A decode pass saved by an earlier (interrupted) run, or None.

  The teacher stage decodes the whole training split twice (greedy, then
  sampled), a student stage once (on-policy data); each pass is saved as
  soon as it finishes so that a restart resumes after it instead of decoding
  again. Same seed, same outputs.
  """
  path = _pass_path(wd, split, name)
  if not os.path.isfile(path):
    return None
  with open(path) as f:
    cached = json.load(f)
  got = len(cached.get("preds", ()))
  if got != n:
    log(f"ignoring {path}: {got} outputs, expected {n}")
    return None
  return cached


def _output_pass(fam: Family, model, params, wd: str, split: str, name: str,
                 sampling, who: str) -> tuple[list, dict]:
  """``model``'s outputs on the ``split`` inputs (target ids, no EOS) and
  their stats; saved to / reused from ``wd`` (:func:`_load_pass`)."""
  examples = fam.examples[split]
  cached = _load_pass(wd, split, name, len(examples))
  if cached is None:
    pair = dm.DefaultPair(fam.task, model, model, params, params, fam.tok,
                          fam.spec.metrics, fam.spec.max_new_tokens,
                          model.is_encoder_decoder, fam.spec)
    t = time.perf_counter()
    preds, stats = dme.decode(pair, decoding.make_method("target_only"),
                              examples, sampling=sampling, verifier="large",
                              batch_size=plan.TEACHER_DECODE_BATCH,
                              seed=plan.TEACHER_SEED)
    cached = dict(preds=preds, stats=dict(
        rows=len(preds), mean_tokens=round(stats["tokens"] / len(preds), 2),
        seconds=round(time.perf_counter() - t, 1)))
    _write_json(_pass_path(wd, split, name), cached, indent=None)
  else:
    log(f"{fam.task}/{who}: {split} {name}: reusing the saved pass")
  log(f"{fam.task}/{who}: {split} {name}: {cached['stats']}")
  ids = [dm.encode_targets(fam.tok, fam.spec, p) for p in cached["preds"]]
  return ids, cached["stats"]


def _ordered_task_examples(fam: Family, corpus) -> list[dict]:
  """The task's examples of the pretraining files' functions, minus
  held-out and training inputs, in the build's fixed random order."""
  used = pretrain_lib.held_out_inputs(corpus) | frozenset(
      e["inputs"] for e in fam.examples["train"])
  exs = pretrain_lib.task_examples(fam.pre, fam.task, used)
  order = np.random.default_rng(plan.DATA_SEED).permutation(len(exs))
  return [exs[i] for i in order]


def _pick_inputs(fam: Family, ordered: list[dict], smoke: bool,
                 split: str) -> list[dict]:
  """:func:`extra_examples` ('extra' or 'more') of the ordered examples."""
  if split == "extra":
    return ordered[:plan.SMOKE_EXAMPLES if smoke else plan.EXTRA_INPUTS]
  extra = frozenset(e["inputs"] for e in fam.examples["extra"])
  more = [e for e in ordered if e["inputs"] not in extra]
  return more[:plan.more_inputs(fam.task, smoke)]


def extra_examples(fam: Family, corpus, smoke: bool,
                   split: str = "extra") -> list[dict]:
  """More task inputs for distillation: the task's examples of the
  pretraining files' functions, minus held-out and training inputs, in a
  fixed random order; their targets are not used.

  Args:
    split: 'extra' (the first ``plan.EXTRA_INPUTS`` of that order) or
      'more' (the next ``plan.more_inputs(task)`` that are not in
      ``fam.examples['extra']``: from one corpus, the ones right after the
      extra inputs; with a bundle's extra inputs (``--data`` with
      ``--export_data``), still none of them; the levels of
      ``plan.MORE_ROWS_LEVELS`` learn from them too).
  """
  if split not in ("extra", "more"):
    raise ValueError(f"split must be 'extra' or 'more', got {split!r}")
  return _pick_inputs(fam, _ordered_task_examples(fam, corpus), smoke, split)


def extend_bundle(args, tasks) -> None:
  """--data with --export_data: the bundle --data plus the example splits
  the plan now wants and it lacks ('more', ``plan.MORE_INPUTS``), drawn
  from this machine's corpus (its other data are copied as they are: the
  stages that ran from it stay reproducible)."""
  old = bundle_lib.read_info(args.data)
  families = families_from_bundle(args, tasks, check_more=False)
  corpus = corpus_lib.default_corpus()
  for task, fam in families.items():
    added = {}
    if plan.more_inputs(task, args.smoke) and "more" not in fam.examples:
      fam.pre = pretrain_lib.build(corpus, args.site_packages or None,
                                   pretrain_bytes(args, task))
      fam.examples["more"] = extra_examples(fam, corpus, args.smoke, "more")
      added["more"] = dict(examples=len(fam.examples["more"]),
                           pretraining_files_hash=fam.pre.files_hash,
                           corpus_hash=corpus.corpus_hash, added_on=ran_on(),
                           command=COMMAND + " ".join(sys.argv[1:]))
    bundle_lib.export(args.export_data, task,
                      os.path.join(args.data, task, bundle_lib.TOKENIZER),
                      fam.examples, fam.bundle, fam.pre_record)
    said = ", ".join(f"{k}: {v}" for k, v in added.items())
    log(f"{task}: {said or 'nothing to add'}")
    info = bundle_lib.read_info(args.export_data)
    info["tasks"][task]["added"] = dict(
        old["tasks"][task].get("added", {}), **added)
    with open(os.path.join(args.export_data, bundle_lib.BUNDLE_JSON),
              "w") as f:
      json.dump(info, f, indent=1)
  bundle_lib.set_info(args.export_data, **{
      k: v for k, v in old.items() if k not in ("format", "tasks")})


def stage_teacher(fam: Family, args, progress: Progress,
                  stage: str = "teacher") -> dict:
  """A large model's outputs and top-k on the training/validation inputs
  (ground truth, greedy and, for train, sampled outputs) and on
  :func:`extra_examples` (greedy only): ``<split>.npz`` rows.

  Args:
    stage: 'teacher' (the shipped large; the students' rows) or
      'self_teacher' (the fine-tuned large of a self-distilling task; its
      large_distill stage's rows).
  """
  wd = os.path.join(args.workdir, fam.task, stage)
  done = stage_done(wd)
  if done and not args.force:
    return done
  if stage == "self_teacher":
    require_done(fam, args, stage, "large")
    source = finetuned_dir(args, fam.task)
  else:
    require_done(fam, args, stage, "large", *(
        ("large_distill",) if self_distills(fam.task) else ()))
    source = os.path.join(args.out, fam.task, dm.LEVEL_DIRS["large"])
  t0 = time.perf_counter()
  model, params = load_saved(source)
  extra = dme.tokenize(fam.tok, fam.spec, fam.examples["extra"])
  report = dict(extra_inputs=len(extra))
  splits = [("validation", fam.val_rows), ("train", fam.train_rows),
            ("extra", extra)]
  if stage == "teacher" and "more" in fam.examples:  # (students' rows only)
    splits.append(("more", dme.tokenize(fam.tok, fam.spec,
                                        fam.examples["more"])))
    report["more_inputs"] = len(splits[-1][1])
  for split, rows in splits:
    path = os.path.join(wd, f"{split}.npz")
    if os.path.isfile(path):  # an earlier run wrote this split's rows
      log(f"{fam.task}/{stage}: {split}: reusing {path}")
      report[f"{split}_topk_seconds"] = "reused"
      continue
    outputs = [("greedy", decoding.Greedy())]
    if split == "train":
      outputs.append(("sampled", decoding.Temperature(1.0)))
    truth = split not in ("extra", "more")
    pairs, data = (list(rows), [True] * len(rows)) if truth else ([], [])
    for name, sampling in outputs:
      ids, report[f"{split}_{name}"] = _output_pass(
          fam, model, params, wd, split, name, sampling, "teacher")
      pairs += [(x, y) for (x, _), y in zip(rows, ids)]
      data += [False] * len(ids)
    t = time.perf_counter()
    out = distill_lib.teacher_rows(
        model, params, pairs, data, dme.batch_maker(fam.spec, fam.tok.eos_id),
        fam.spec.family, k=plan.TOP_K, batch_size=plan.TEACHER_FORWARD_BATCH,
        log=lambda s: log(f"{fam.task}/{stage}: {s}"))
    distill_lib.save_rows(path, out)
    report[f"{split}_topk_seconds"] = round(time.perf_counter() - t, 1)
  report["wall_seconds"] = round(time.perf_counter() - t0, 1)
  mark_done(wd, report)
  progress.add(task=fam.task, stage=stage, wall_seconds=report[
      "wall_seconds"])
  return report


def _distill_data(fam: Family, args, teacher: str = "teacher",
                  level: str | None = None):
  """(training rows, make, validation batches) of the rows of the stage
  ``teacher`` ('teacher' or 'self_teacher'); a ``level`` of
  ``plan.MORE_ROWS_LEVELS`` also gets the teacher's 'more' rows."""
  tdir = os.path.join(args.workdir, fam.task, teacher)
  rows = distill_lib.load_rows(os.path.join(tdir, "train.npz"))
  if os.path.isfile(os.path.join(tdir, "extra.npz")):
    rows += distill_lib.load_rows(os.path.join(tdir, "extra.npz"))
  if level in plan.MORE_ROWS_LEVELS.get(fam.task, ()):
    more = os.path.join(tdir, "more.npz")
    if not os.path.isfile(more):
      raise SystemExit(
          f"{more} is missing: the teacher stage of {fam.task} predates its "
          f"'more' split (plan.MORE_INPUTS); delete "
          f"{os.path.join(tdir, 'done.json')} and run --only teacher (the "
          f"saved passes and rows are reused)")
    rows += distill_lib.load_rows(more)
  val = distill_lib.load_rows(os.path.join(tdir, "validation.npz"))
  base = dme.batch_maker(fam.spec, fam.tok.eos_id, plan.PROMPT_WEIGHT)
  make = lambda rs: distill_lib.batch(rs, base, fam.spec.family)
  val = sorted(val, key=lambda r: len(r.inputs) + len(r.targets))
  evals = [make(val[i:i + 32]) for i in range(0, len(val), 32)]
  return rows, make, evals


def stage_large_distill(fam: Family, args, progress: Progress) -> dict:
  """The fine-tuned large distilled from self_teacher's rows: its own greedy
  and sampled outputs (KL to its top-k) plus the ground truth (data loss),
  from its fine-tuned parameters -> the shipped verifier
  (``plan.SELF_DISTILL_TASKS``). keep='metric': of its best-objective and
  last parameters, the one with the better greedy BLEU on the whole
  validation split (the distillation objective, KL to its own outputs
  included, says little about greedy quality)."""
  wd = os.path.join(args.workdir, fam.task, "large_distill")
  done = stage_done(wd)
  if done and not args.force:
    return done
  require_done(fam, args, "large_distill", "large", "self_teacher")
  st = plan.stage(fam.task, "large_distill", args.smoke, args.smoke_steps)
  if st.keep not in ("best", "metric"):  # checked before training
    raise ValueError(f"large_distill keeps 'best' or 'metric', not "
                     f"{st.keep!r}")
  t0 = time.perf_counter()
  model, params = load_saved(finetuned_dir(args, fam.task))
  rows, make, evals = _distill_data(fam, args, "self_teacher")
  best, report = run_training(f"{fam.task}/large_distill", model, params,
                              st.config, rows, make, st.batch_size, evals, wd)
  report["kept_step"] = report["best_step"]
  exs = fam.examples["validation"]
  if st.keep == "metric":
    state = train_lib.restore_state(wd, train_lib.init_state(
        params, st.config))
    if state is not None and int(state[0].step) != report["best_step"]:
      last, last_step = jax.device_get(state[0].params), int(state[0].step)
      best, report["kept_step"], report["candidates"] = choose_by_metric(
          fam, model, {report["best_step"]: best, last_step: last}, wd, exs)
  out = os.path.join(args.out, fam.task, dm.LEVEL_DIRS["large"])
  report.update(save_model(out, model, best))
  report["check"] = check_large(fam, out, exs)
  report["wall_seconds"] = round(time.perf_counter() - t0, 1)
  mark_done(wd, report)
  progress.add(task=fam.task, stage="large_distill", **{
      k: report[k] for k in ("best_eval_objective", "train_seconds",
                             "tokens_per_s", "wall_seconds")})
  return report


def _onpolicy_round(fam: Family, level: str, args, model, params, rows, make,
                    evals, report: dict):
  """Round 2 of :func:`stage_distill`: ``params`` write greedy outputs on
  the training and extra inputs, the shipped large scores them (top-k) and
  training goes on over ``rows`` and those. Returns (params, report)."""
  wd = os.path.join(args.workdir, fam.task, level)
  st2 = plan.stage(fam.task, f"{level}_onpolicy", args.smoke,
                   args.smoke_steps)
  onpolicy = os.path.join(wd, "onpolicy.npz")
  if os.path.isfile(onpolicy):
    more = distill_lib.load_rows(onpolicy)
  else:
    pairs = []
    for split, inputs in (("train", fam.train_rows), ("extra", dme.tokenize(
        fam.tok, fam.spec, fam.examples["extra"]))):
      ids, report[f"{split}_student_greedy"] = _output_pass(
          fam, model, params, wd, split, "student_greedy", decoding.Greedy(),
          level)
      pairs += [(x, y) for (x, _), y in zip(inputs, ids)]
    large, lp = load_saved(os.path.join(args.out, fam.task,
                                        dm.LEVEL_DIRS["large"]))
    more = distill_lib.teacher_rows(
        large, lp, pairs, [False] * len(pairs),
        dme.batch_maker(fam.spec, fam.tok.eos_id),
        fam.spec.family, k=plan.TOP_K, batch_size=plan.TEACHER_FORWARD_BATCH,
        log=lambda s: log(f"{fam.task}/{level}: on-policy {s}"))
    distill_lib.save_rows(onpolicy, more)
  best, report2 = run_training(f"{fam.task}/{level}/onpolicy", model, params,
                               st2.config, rows + more, make, st2.batch_size,
                               evals, os.path.join(wd, "onpolicy"))
  return best, dict(report2, first_round=report, onpolicy_rows=len(more),
                    train_seconds=report["train_seconds"] +
                    report2["train_seconds"])


def stage_distill(fam: Family, level: str, args, progress: Progress) -> dict:
  """medium / small: a student distilled from the shipped large model.

  Two rounds (DistillSpec): (1) from the pretrained student, on the
  teacher's rows (ground truth + the teacher's greedy and sampled outputs,
  and its greedy outputs on the extra inputs, and on the 'more' inputs for
  the levels of ``plan.MORE_ROWS_LEVELS``); (2) where the plan has a
  '<level>_onpolicy' stage (``plan.has_onpolicy``), the student then writes
  greedy outputs on the training and extra inputs
  (:func:`extra_examples`), the teacher scores them (top-k along the
  student's own tokens: on-policy data, where the drafter's mistakes are)
  and training goes on over both.
  The round-2 state lives in ``<workdir>/<task>/<level>/onpolicy``.
  """
  wd = os.path.join(args.workdir, fam.task, level)
  done = stage_done(wd)
  if done and not args.force:
    return done
  require_done(fam, args, level, f"{level}_pretrain", "teacher")
  st = plan.stage(fam.task, level, args.smoke, args.smoke_steps)
  t0 = time.perf_counter()
  model = model_from_config(plan.arch(fam.task, level, fam.tok))
  params = _load_npz_params(os.path.join(
      args.workdir, fam.task, f"{level}_pretrain", "final_params.npz"), model)
  rows, make, evals = _distill_data(fam, args, level=level)
  best, report = run_training(f"{fam.task}/{level}", model, params, st.config,
                              rows, make, st.batch_size, evals, wd)
  report["rows"] = len(rows)
  if plan.has_onpolicy(fam.task, level):
    best, report = _onpolicy_round(fam, level, args, model, best, rows, make,
                                   evals, report)
  report.update(save_model(os.path.join(args.out, fam.task,
                                        dm.LEVEL_DIRS[level]), model, best))
  report["wall_seconds"] = round(time.perf_counter() - t0, 1)
  mark_done(wd, report)
  progress.add(task=fam.task, stage=level, **{
      k: report[k] for k in ("best_eval_objective", "train_seconds",
                             "tokens_per_s", "wall_seconds")})
  return report


# -------------------------------------------------------------- evaluation


def stage_eval(fam: Family, args, progress: Progress) -> dict:
  """Full test-split evaluation, costs and the test slice of one family."""
  wd = os.path.join(args.workdir, fam.task, "eval")
  done = stage_done(wd)
  if done and not args.force:
    return done
  require_done(fam, args, "eval", "large", "medium", "small")
  t0 = time.perf_counter()
  pair = dm.load(fam.task, assets=args.out)
  test = fam.examples["test"]
  if args.eval_limit:
    test = test[:args.eval_limit]
  log(f"{fam.task}: evaluating on {len(test)} test examples")
  say = lambda s: log(s)
  report = dme.evaluate_family(pair, test, with_timing=True, log=say)
  make = dme.batch_maker(fam.spec, fam.tok.eos_id, 0.0)
  for level in dm.LEVELS:
    m, p = pair.model(level)
    report["levels"][level]["validation_loss"] = round(
        dme.heldout_loss(m, p, fam.val_rows, make), 5)
  preds, stats = dme.decode(pair, decoding.make_method("spec_decode"), test,
                            sampling=decoding.Temperature(1.0))
  report["acceptance_t1_small>large"] = round(
      stats["accepted"] / stats["drafted"], 5)
  report["cost"] = plan.costs(pair)
  log(f"{fam.task}: cost {report['cost']}")
  exs = dm.examples(fam.task, "test", limit=plan.SLICE_EXAMPLES)
  report["slice"] = dme.evaluate_family(pair, exs,
                                        batch_size=plan.SLICE_EXAMPLES)
  report["wall_seconds"] = round(time.perf_counter() - t0, 1)
  mark_done(wd, report)
  progress.add(task=fam.task, stage="eval", wall_seconds=report[
      "wall_seconds"])
  return report


# ---------------------------------------------------------------- metadata


def _pretraining_meta(pre, max_bytes: int) -> dict:
  return dict(site_packages=pre.site_packages, files_hash=pre.files_hash,
              max_bytes=max_bytes, seed=pretrain_lib.PRETRAIN_SEED,
              stats=pre.stats, files=pre.file_list())


def write_metadata(args, corpus, families: dict, reports: dict) -> None:
  path = os.path.join(args.out, dm.METADATA)
  pairs = {}
  tokenizers = {}
  for task, fam in families.items():
    rep = reports.get(task, {})
    tokenizers[task] = dict(
        family=fam.spec.family, vocab_size=fam.tok.vocab_size, extra_ids=0,
        fingerprint=fam.tok.fingerprint, options=dm.SPM_OPTIONS,
        mb=round(os.path.getsize(os.path.join(args.out, task, dm.TOKENIZER))
                 / 2**20, 3))
    ev = rep.get("eval", {})
    pairs[task] = dict(
        task=dataclasses.asdict(fam.spec),
        stages={k: {f: x for f, x in v.items() if f != "pretraining"}
                for k, v in rep.items() if k != "eval"},
        evaluation={k: v for k, v in ev.items() if k != "slice"},
        slice={**ev.get("slice", {}), "split": "test",
               "batch_size": plan.SLICE_EXAMPLES})
  meta = dict(
      description="Built-in default model families (small / medium / large) "
                  "trained on the CPython standard library and pip packages' "
                  "text; see docs/default_models.md",
      command=COMMAND + " ".join(sys.argv[1:]),
      python=platform.python_version(), jax=jax.__version__,
      machine=f"{platform.machine()} {os.cpu_count()} cpus, "
              f"{jax.default_backend()}",
      plan=plan.describe(args.smoke, args.smoke_steps),
      corpus=dict(
          stdlib_root=corpus.root, corpus_hash=corpus.corpus_hash,
          split_seed=corpus_lib.SPLIT_SEED,
          split_percent=dict(test=corpus_lib.TEST_PERCENT,
                             validation=corpus_lib.VALIDATION_PERCENT),
          skip_dirs=sorted(corpus_lib.SKIP_DIRS), stats=corpus.stats,
          examples_hash={t: corpus.examples_hash(t) for t in corpus_lib.TASKS},
          files=list(corpus.files)),
      # What each family's large model read (recorded by its stage: the
      # pip packages of this machine may have changed since).
      pretraining={task: reports.get(task, {}).get("large_pretrain", {}).get(
          "pretraining") or fam.pretraining_record(pretrain_bytes(args, task))
                   for task, fam in families.items()},
      tokenizers=tokenizers, pairs=pairs)
  _write_json(path, meta)
  log(f"wrote {path}")


def pretrain_bytes(args, task: str) -> int:
  """Bytes of pretraining text for ``task``: --pretrain_bytes, else the
  plan's budget (the smoke budget with --smoke)."""
  if args.pretrain_bytes:
    return args.pretrain_bytes
  return plan.SMOKE_PRETRAIN_BYTES if args.smoke else plan.PRETRAIN_BYTES[task]


def run_stage(fam: Family, stage: str, args, corpus,
              progress: Progress) -> dict:
  """Runs (or, once done, skips) one stage of one family."""
  if stage == "large" or stage.endswith("_pretrain"):
    return stage_train(fam, stage, args, corpus, progress)
  if stage in ("teacher", "self_teacher"):
    return stage_teacher(fam, args, progress, stage)
  if stage == "large_distill":
    return stage_large_distill(fam, args, progress)
  if stage in ("medium", "small"):
    return stage_distill(fam, stage, args, progress)
  return stage_eval(fam, args, progress)


def families_from_corpus(args, tasks, corpus) -> dict:
  """{task: Family} read from this machine's stdlib and pip packages."""
  pres = {}  # max bytes -> PretrainCorpus (built once per budget)
  families = {}
  for task in tasks:
    spec = dm.TASKS[task]
    tok = build_tokenizer(task, corpus, args.out, args.force)
    exs = {s: corpus.examples[task][s] for s in corpus_lib.SPLITS}
    if args.smoke:
      exs = {s: v[:plan.SMOKE_EXAMPLES] for s, v in exs.items()}
    fam = Family(task, spec, tok, dme.tokenize(tok, spec, exs["train"]),
                 dme.tokenize(tok, spec, exs["validation"]), exs)
    n = pretrain_bytes(args, task)
    if n not in pres:
      pres[n] = pretrain_lib.build(corpus, args.site_packages or None, n)
      log(f"pretraining text ({n:,} bytes): {len(pres[n].documents)} files, "
          f"hash {pres[n].files_hash[:16]}, {json.dumps(pres[n].stats)}")
    fam.pre = pres[n]
    ordered = _ordered_task_examples(fam, corpus)  # (parsed once)
    exs["extra"] = _pick_inputs(fam, ordered, args.smoke, "extra")
    if plan.more_inputs(task, args.smoke):
      exs["more"] = _pick_inputs(fam, ordered, args.smoke, "more")
    families[task] = fam
  return families


def export_bundle(args, families: dict, corpus) -> None:
  """--export_data: every family's training data into a bundle."""
  for task, fam in families.items():
    if fam.spec.family == "gemma":
      pretrain = {"stream": pretrain_stream(fam, args.workdir)}
    else:
      pretrain = {}
      for level in dm.LEVELS:
        flag = uses_prefix_lm(fam, level)
        if flag not in pretrain:
          pretrain[flag] = pretrain_data(fam, corpus, args.workdir, level)[0]
    bundle_lib.export(args.export_data, task,
                      os.path.join(args.out, task, dm.TOKENIZER),
                      fam.examples, pretrain,
                      fam.pretraining_record(pretrain_bytes(args, task)))
  bundle_lib.set_info(args.export_data, smoke=args.smoke,
                      exported_on=ran_on(), corpus_hash=corpus.corpus_hash,
                      command=COMMAND + " ".join(sys.argv[1:]))


def families_from_bundle(args, tasks, check_more: bool = True) -> dict:
  """--data: {task: Family} from a bundle (no corpus on this machine);
  ``check_more``: the bundle must hold the 'more' split the plan wants."""
  info = bundle_lib.read_info(args.data)
  if bool(info.get("smoke")) != bool(args.smoke):
    raise SystemExit(
        f"the data bundle {args.data} was exported "
        f"{'with' if info.get('smoke') else 'without'} --smoke; run the "
        f"stages {'with' if info.get('smoke') else 'without'} it too")
  families = {}
  for task in tasks:
    try:
      data = bundle_lib.load_task(args.data, task)
    except ValueError as e:
      raise SystemExit(str(e)) from None
    spec = dm.TASKS[task]
    path = os.path.join(args.out, task, dm.TOKENIZER)
    if os.path.isfile(path):
      with open(path, "rb") as f, open(data["tokenizer"], "rb") as g:
        if f.read() != g.read():
          raise SystemExit(
              f"{path} differs from the data bundle's tokenizer: this --out "
              f"belongs to another build; use a fresh --out (or delete it)")
    else:
      os.makedirs(os.path.dirname(path), exist_ok=True)
      shutil.copyfile(data["tokenizer"], path)
    tok = tokenizer_lib.Tokenizer(path, spec.family, extra_ids=0)
    exs = data["examples"]
    if check_more and plan.more_inputs(task, args.smoke) and (
        "more" not in exs):
      raise SystemExit(
          f"the data bundle {args.data} has no 'more' examples of {task}, "
          f"the plan wants {plan.more_inputs(task, args.smoke)} "
          f"(plan.MORE_INPUTS): add them "
          f"where the corpus is with --data {args.data} --export_data NEW_DIR "
          f"and run with --data NEW_DIR")
    fam = Family(task, spec, tok, dme.tokenize(tok, spec, exs["train"]),
                 dme.tokenize(tok, spec, exs["validation"]), exs,
                 bundle=data["pretrain"],
                 pre_record=data["record"]["pretraining"])
    families[task] = fam
    log(f"{task}: data from the bundle {args.data} (exported on "
        f"{info.get('exported_on', '?')})")
  return families


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", default=dm.ASSETS)
  ap.add_argument("--workdir", default="/tmp/specdec_default_models")
  ap.add_argument("--pairs", default=",".join(dm.PAIRS))
  ap.add_argument("--until", default="eval", choices=STAGES,
                  help="stop after this stage (e.g. 'large' to check the "
                  "large models before distilling)")
  ap.add_argument("--only", default="",
                  help="comma-separated stages to run, and nothing else "
                  "(e.g. 'small_pretrain,medium_pretrain', which need only the "
                  "tokenizer, in a second process beside the large "
                  "stages); the metadata is then not written")
  ap.add_argument("--report", default="benchmarks/results/default_models.md",
                  help="Markdown report written from metadata.json ('' for "
                  "none)")
  ap.add_argument("--site_packages",
                  default=pretrain_lib.site_packages_dir(),
                  help="pip packages' directory read for pretraining text "
                  "('' for stdlib only)")
  ap.add_argument("--pretrain_bytes", type=int, default=0,
                  help="bytes of pretraining text for every family (0: the "
                  "plan's per-family budget, plan.PRETRAIN_BYTES)")
  ap.add_argument("--eval_limit", type=int, default=0,
                  help="evaluate on the first N test examples (0: all)")
  ap.add_argument("--force", action="store_true",
                  help="redo finished stages (state files are kept: delete "
                  "the workdir to start from scratch)")
  ap.add_argument("--smoke", action="store_true",
                  help="a few steps per stage and little data (pipeline "
                  "check)")
  ap.add_argument("--smoke_steps", type=int, default=4)
  ap.add_argument("--export_data", default="",
                  help="write the training data of --pairs (tokenizer, "
                  "examples, tokenized pretraining items) into this directory "
                  "and stop; another machine runs the stages with --data "
                  "(bundle.py); with --data: that "
                  "bundle plus the example splits the plan now wants and it "
                  "lacks, from this machine's corpus")
  ap.add_argument("--data", default="",
                  help="run the training stages from a bundle written by "
                  "--export_data instead of this machine's corpus (no eval, "
                  "no metadata: those run where the corpus is)")
  args = ap.parse_args()
  jax.config.update("jax_compilation_cache_dir",
                    os.path.join(args.workdir, "xla_cache"))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
  if args.smoke and os.path.abspath(args.out) == os.path.abspath(dm.ASSETS):
    ap.error("--smoke needs --out outside the shipped assets")
  tasks = [t for t in args.pairs.split(",") if t]
  bad = [t for t in tasks if t not in dm.TASKS]
  if bad:
    ap.error(f"unknown pair {bad[0]!r}; choose from {dm.PAIRS}")
  only = [s for s in args.only.split(",") if s]
  if [s for s in only if s not in STAGES]:
    ap.error(f"unknown stage in --only {args.only!r}; choose from {STAGES}")
  if args.data and args.export_data:
    if os.path.abspath(args.data) == os.path.abspath(args.export_data):
      ap.error("--export_data must be a new directory, not --data's")
    extend_bundle(args, tasks)
    log(f"wrote the data bundle {args.export_data} (from {args.data})")
    return
  t0 = time.perf_counter()
  progress = Progress(args.workdir)
  reports = {t: {} for t in tasks}
  if args.data:
    corpus = None
    families = families_from_bundle(args, tasks)
  else:
    corpus = corpus_lib.default_corpus()
    log(f"corpus: {len(corpus.files)} files, hash "
        f"{corpus.corpus_hash[:16]}")
    families = families_from_corpus(args, tasks, corpus)
  if args.export_data:
    export_bundle(args, families, corpus)
    log(f"wrote the data bundle {args.export_data} in "
        f"{time.perf_counter() - t0:.0f}s")
    return
  order = [(s, t) for s in ("large_pretrain", "large") for t in tasks]
  order += [(s, t) for t in tasks for s in STAGES[2:-1]]
  order += [("eval", t) for t in tasks]
  last = STAGES.index(args.until)
  if args.data and last == STAGES.index("eval"):
    log("--data: the eval stage and the metadata need the corpus; they run "
        "on the exporting machine")
    last -= 1
  for stage, task in order:
    if STAGES.index(stage) > last or only and stage not in only:
      continue
    if stage in SELF_STAGES and not self_distills(task):
      continue
    fam = families[task]
    log(f"=== {task}: {stage}")
    with stage_lock(os.path.join(args.workdir, task, f"{stage}.lock"),
                    f"{task}/{stage}", log):
      reports[task][stage] = run_stage(fam, stage, args, corpus, progress)
  if only or args.data:
    log(f"done in {time.perf_counter() - t0:.0f}s (--only / --data: "
        "metadata not written)")
    return
  write_metadata(args, corpus, families, reports)
  if last == STAGES.index("eval") and args.report:
    with open(os.path.join(args.out, dm.METADATA)) as f:
      meta = json.load(f)
    os.makedirs(os.path.dirname(os.path.abspath(args.report)), exist_ok=True)
    with open(args.report, "w") as f:
      f.write(plan.report_markdown(meta))
    log(f"wrote {args.report}")
  log(f"done in {time.perf_counter() - t0:.0f}s")


if __name__ == "__main__":
  main()
