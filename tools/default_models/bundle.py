"""A default-model build's training data, portable to another machine.

The build reads its data from this machine's CPython standard library and
pip packages (``specdec_jax/families/corpus.py``, ``pretraining.py``); another machine
(a lent accelerator, a TPU VM) has other files. ``build.py
--export_data DIR`` writes everything the training stages read into DIR, and
``--data DIR`` runs the stages from it anywhere:

  DIR/bundle.json                   format, smoke setting, tasks, where and
                                    from what it was exported, per task the
                                    pretraining text's record
  DIR/<task>/tokenizer.model        the task's SentencePiece model
  DIR/<task>/examples.json          the examples' text per split ('train',
                                    'validation', 'test', 'extra': the
                                    teacher-only distillation inputs;
                                    'more': further ones, where the plan
                                    has them)
  DIR/<task>/pretrain_<kind>.npz    tokenized pretraining items: 'pairs'
                                    (T5 task pairs) and 'pairs_prefix_lm'
                                    (with the prefix-LM pairs) as flat ids +
                                    lengths; 'stream' (Gemma: the token
                                    stream its windows are cut from)

Evaluation and metadata need the corpus and stay on the exporting machine:
copy the stages' workdir and out back and run the build there.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import numpy as np

FORMAT = 1
BUNDLE_JSON = "bundle.json"
EXAMPLES_JSON = "examples.json"
TOKENIZER = "tokenizer.model"
SPLITS = ("train", "validation", "test", "extra")
OPTIONAL_SPLITS = ("more",)  # exported when the family has them


def _kind(prefix_lm: bool) -> str:
  return "pairs_prefix_lm" if prefix_lm else "pairs"


def _save_pairs(path: str, items) -> None:
  """[(input ids, target ids)] -> npz of flat int16 ids and int32 lengths."""
  flat = lambda xs: np.asarray([i for x in xs for i in x], np.int16)
  np.savez_compressed(
      path, inputs=flat(x for x, _ in items), targets=flat(y for _, y in items),
      input_lengths=np.asarray([len(x) for x, _ in items], np.int32),
      target_lengths=np.asarray([len(y) for _, y in items], np.int32))


def _load_pairs(path: str) -> list[tuple[list[int], list[int]]]:
  with np.load(path) as f:
    x, y = f["inputs"].astype(int).tolist(), f["targets"].astype(int).tolist()
    nx, ny = f["input_lengths"].tolist(), f["target_lengths"].tolist()
  out, i, j = [], 0, 0
  for a, b in zip(nx, ny):
    out.append((x[i:i + a], y[j:j + b]))
    i, j = i + a, j + b
  return out


def _sha256(path: str) -> str:
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()


def export(dest: str, task: str, tokenizer_path: str, examples: dict,
           pretrain: dict, pretraining_record: dict) -> None:
  """Writes one task's data into ``dest`` (see the module docstring).

  Args:
    dest: the bundle directory (created; other tasks' files are kept).
    task: the task name.
    tokenizer_path: its SentencePiece model.
    examples: {split: [{'id', 'inputs', 'targets'}]} with every split of
      :data:`SPLITS`.
    pretrain: {prefix_lm (bool): items} for T5 ([(inputs, targets)]), or
      {'stream': int array} for Gemma.
    pretraining_record: what the pretraining text was (files, hash, bytes).
  """
  missing = [s for s in SPLITS if s not in examples]
  if missing:
    raise ValueError(f"{task}: no {missing[0]!r} examples to export")
  d = os.path.join(dest, task)
  os.makedirs(d, exist_ok=True)
  shutil.copyfile(tokenizer_path, os.path.join(d, TOKENIZER))
  with open(os.path.join(d, EXAMPLES_JSON), "w") as f:
    json.dump({s: examples[s] for s in SPLITS + OPTIONAL_SPLITS
               if s in examples}, f)
  kinds = []
  for key, items in pretrain.items():
    if key == "stream":
      np.savez_compressed(os.path.join(d, "pretrain_stream.npz"),
                          stream=np.asarray(items, np.int16))
      kinds.append("stream")
    else:
      _save_pairs(os.path.join(d, f"pretrain_{_kind(key)}.npz"), items)
      kinds.append(_kind(key))
  record = dict(tokenizer_sha256=_sha256(os.path.join(d, TOKENIZER)),
                pretrain=sorted(kinds), pretraining=pretraining_record,
                examples={s: len(examples[s]) for s in SPLITS + OPTIONAL_SPLITS
                          if s in examples})
  info = read_info(dest) if os.path.isfile(os.path.join(
      dest, BUNDLE_JSON)) else dict(format=FORMAT, tasks={})
  info["tasks"][task] = record
  with open(os.path.join(dest, BUNDLE_JSON), "w") as f:
    json.dump(info, f, indent=1)


def set_info(dest: str, **fields) -> None:
  """Adds top-level fields (smoke setting, source machine) to bundle.json."""
  path = os.path.join(dest, BUNDLE_JSON)
  with open(path) as f:
    info = json.load(f)
  info.update(fields)
  with open(path, "w") as f:
    json.dump(info, f, indent=1)


def read_info(src: str) -> dict:
  """bundle.json of ``src``; a clear error if it is not a bundle."""
  path = os.path.join(src, BUNDLE_JSON)
  if not os.path.isfile(path):
    raise ValueError(f"{src!r} is not a data bundle ({BUNDLE_JSON} is "
                     f"missing); write one with build.py "
                     f"--export_data {src}")
  with open(path) as f:
    info = json.load(f)
  if info.get("format") != FORMAT:
    raise ValueError(f"{path}: bundle format {info.get('format')!r}, this "
                     f"script reads format {FORMAT}; export it again")
  return info


def load_task(src: str, task: str) -> dict:
  """One task's data: {'tokenizer', 'examples', 'pretrain', 'record'}.

  ``pretrain`` is {prefix_lm (bool): [(inputs, targets)]} for T5 and
  {'stream': int32 array} for Gemma (as :func:`export` got them).
  """
  info = read_info(src)
  if task not in info["tasks"]:
    raise ValueError(f"the data bundle {src!r} has no task {task!r} (it has "
                     f"{', '.join(sorted(info['tasks']))}); export it with "
                     f"--pairs {task}")
  record = info["tasks"][task]
  d = os.path.join(src, task)
  tok = os.path.join(d, TOKENIZER)
  if _sha256(tok) != record["tokenizer_sha256"]:
    raise ValueError(f"{tok} does not match the tokenizer the bundle was "
                     f"exported with; export the bundle again")
  with open(os.path.join(d, EXAMPLES_JSON)) as f:
    examples = json.load(f)
  pretrain = {}
  for kind in record["pretrain"]:
    path = os.path.join(d, f"pretrain_{kind}.npz")
    if kind == "stream":
      with np.load(path) as f:
        pretrain["stream"] = f["stream"].astype(np.int32)
    else:
      pretrain[kind == "pairs_prefix_lm"] = _load_pairs(path)
  return dict(tokenizer=tok, examples=examples, pretrain=pretrain,
              record=record)


__all__ = ["BUNDLE_JSON", "FORMAT", "SPLITS", "export", "load_task",
           "read_info", "set_info", "OPTIONAL_SPLITS"]
