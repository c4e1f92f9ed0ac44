"""Saves a default-model build's progress to a small directory, and back.

The build (``build.py``) runs for longer than one session on
2 cores, and a session's machine (with ``--workdir`` / ``--out``) may not be
the next one's. ``save`` copies what a restarted build needs into a small
directory (kept outside the repository: build state is
not committed, tests/test_repo_size.py); ``restore`` writes it back into a fresh
workdir / out, and the build then resumes where the snapshot was taken:

  python -m tools.default_models.snapshot save \\
      --workdir /work/dm_work --out /work/dm_out \\
      --dest /work/dm_snapshot
  python -m tools.default_models.snapshot restore \\
      --workdir /work/dm_work --out /work/dm_out \\
      --dest /work/dm_snapshot

What is kept (everything else is recomputed by the build, deterministically):

  <out>/<task>/*.model, <out>/<task>/<level>/   tokenizers, finished models
                                                (bfloat16 as shipped)
  <workdir>/progress.jsonl, <stage>/done.json   finished stages (the
                                                teacher's only once both
                                                students are finished: its
                                                top-k rows are not kept)
  <stage>/final_params.npz                      a pretraining stage's result
                                                while its next stage is not
                                                finished (already bfloat16
                                                values: exact)
  <task>/large/model/                           a self-distilling task's
                                                fine-tuned large while its
                                                self_teacher or large_distill
                                                stage is not finished
  <stage>[/onpolicy]/train_state.npz,           a stage in progress that has
  best_params.npz, history.json                 trained >= --min_running_minutes,
                                                as bfloat16 (see below; no
                                                best_params for pretraining,
                                                which keeps its last)
  teacher/*_outputs.json, <level>/*_outputs.json
                                                finished decode passes

Not kept: the tokenized pretraining text, the teacher's and the on-policy
top-k rows (``*.npz`` of ``distill.save_rows``; recomputed from the kept
passes), lock files, the XLA cache.

Stage results are bfloat16-rounded by the build itself
(``build.to_bf16``), so a finished stage restores exactly. A
stage in progress is stored with its float32 parameters and AdamW moments
rounded to bfloat16 (half the bytes; the integer step counters exactly): it
resumes at the same step and data position, from state that differs from
the uninterrupted run's by that rounding.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil

import numpy as np

BEST_FILE = "best_params.npz"
STATE_FILES = ("train_state.npz", BEST_FILE)
BF16_PREFIX = "bf16__"
MANIFEST = "manifest.json"
# stage -> the stages that read its result (its result is kept while one of
# them is unfinished).
CONSUMERS = {"large_pretrain": ("large",),
             "large": ("self_teacher", "large_distill"),
             "self_teacher": ("large_distill",),
             "teacher": ("medium", "small"),
             "medium_pretrain": ("medium",), "small_pretrain": ("small",)}
# The fine-tuned large of a self-distilling task (plan.SELF_DISTILL_TASKS),
# saved apart from the shipped verifier; only such a task has a
# self_teacher and large_distill stage to wait for.
FINETUNED = "large/model"
SELF_STAGES = ("self_teacher", "large_distill")


def _pending(tdir: str, consumer: str) -> bool:
  """Whether the stage ``consumer`` of the task in ``tdir`` is still to
  run."""
  if consumer in SELF_STAGES and not os.path.isdir(
      os.path.join(tdir, FINETUNED)):
    return False
  return not _done(os.path.join(tdir, consumer))


def _bf16_bits(x: np.ndarray) -> np.ndarray:
  """float32 -> bfloat16 bit patterns (round to nearest even) as uint16."""
  import ml_dtypes  # pylint: disable=g-import-not-at-top
  return x.astype(ml_dtypes.bfloat16).view(np.uint16)


def _from_bits(bits: np.ndarray) -> np.ndarray:
  import ml_dtypes  # pylint: disable=g-import-not-at-top
  return bits.view(ml_dtypes.bfloat16).astype(np.float32)


def pack_npz(src: str, dst: str) -> None:
  """Copies an npz, float32 arrays as bfloat16 bits (others unchanged)."""
  with np.load(src) as data:
    arrays = {}
    for k in data.files:
      a = data[k]
      if a.dtype == np.float32 and a.ndim > 0:
        arrays[BF16_PREFIX + k] = _bf16_bits(a)
      else:
        arrays[k] = a
  os.makedirs(os.path.dirname(dst), exist_ok=True)
  np.savez_compressed(dst, **arrays)


def unpack_npz(src: str, dst: str) -> None:
  """Inverse of :func:`pack_npz` (bfloat16 bits back to float32)."""
  with np.load(src) as data:
    arrays = {}
    for k in data.files:
      if k.startswith(BF16_PREFIX):
        arrays[k[len(BF16_PREFIX):]] = _from_bits(data[k])
      else:
        arrays[k] = data[k]
  os.makedirs(os.path.dirname(dst), exist_ok=True)
  tmp = dst + ".tmp.npz"
  np.savez(tmp, **arrays)
  os.replace(tmp, dst)


def _done(stage_dir: str) -> bool:
  return os.path.isfile(os.path.join(stage_dir, "done.json"))


def _trained_seconds(stage_dir: str) -> float:
  """Seconds of training behind a stage's state (both rounds), from the
  ``history.json`` rows' ``elapsed_s`` (which restarts with each resumed
  segment)."""
  total = 0.0
  for sub in ("", "onpolicy"):
    path = os.path.join(stage_dir, sub, "history.json")
    if not os.path.isfile(path):
      continue
    with open(path) as f:
      rows = [h["elapsed_s"] for h in json.load(f) if "elapsed_s" in h]
    total += sum(a for a, b in zip(rows, rows[1:] + [None])
                 if b is None or b < a)
  return total


def plan_files(workdir: str, out: str, min_running_seconds: float = 0.0
               ) -> list[tuple[str, str, str]]:
  """[(kind, source path, path in the snapshot)] of what :func:`save` keeps.

  A stage in progress is kept once it has trained for
  ``min_running_seconds`` (a short one is cheaper to redo than to commit).

  kind: 'copy' (bytes as they are) or 'pack' (:func:`pack_npz`). Paths in
  the snapshot are 'workdir/...' or 'out/...'.
  """
  files = []

  def add(kind, root, name, rel):
    path = os.path.join(root, rel)
    if os.path.isfile(path):
      files.append((kind, path, f"{name}/{rel}"))

  add("copy", workdir, "workdir", "progress.jsonl")
  tasks = sorted(d for d in os.listdir(workdir)
                 if os.path.isdir(os.path.join(workdir, d)) and
                 d != "xla_cache") if os.path.isdir(workdir) else []
  for task in tasks:
    tdir = os.path.join(workdir, task)
    for stage in sorted(os.listdir(tdir)):
      sdir = os.path.join(tdir, stage)
      if not os.path.isdir(sdir):
        continue
      rel = f"{task}/{stage}"
      needed = any(_pending(tdir, c) for c in CONSUMERS.get(stage, ()))
      done = _done(sdir)
      # A teacher's top-k rows are not kept: it reruns (from its saved
      # passes) while a consumer is unfinished.
      if done and (stage not in ("teacher", "self_teacher") or not needed):
        add("copy", workdir, "workdir", f"{rel}/done.json")
      for name in sorted(os.listdir(sdir)):
        if name.endswith("_outputs.json"):
          add("copy", workdir, "workdir", f"{rel}/{name}")
      if done and needed and stage.endswith("_pretrain"):
        add("pack", workdir, "workdir", f"{rel}/final_params.npz")
      if done and needed and stage == "large":
        model_dir = os.path.join(tdir, FINETUNED)
        for name in (sorted(os.listdir(model_dir))
                     if os.path.isdir(model_dir) else ()):
          add("copy", workdir, "workdir", f"{task}/{FINETUNED}/{name}")
      if not done and _trained_seconds(sdir) >= min_running_seconds:
        for sub in ("", "onpolicy"):  # in progress: its training state(s)
          d = f"{rel}/{sub}".rstrip("/")
          for name in STATE_FILES:
            # A pretraining stage keeps its last parameters: its best ones
            # are not needed to resume.
            if not (stage.endswith("_pretrain") and name == BEST_FILE):
              add("pack", workdir, "workdir", f"{d}/{name}")
          add("copy", workdir, "workdir", f"{d}/history.json")
  if os.path.isdir(out):
    for root, _, names in os.walk(out):
      for name in sorted(names):
        rel = os.path.relpath(os.path.join(root, name), out)
        if not name.endswith((".tmp", ".lock")):
          add("copy", out, "out", rel)
  return files


def save(workdir: str, out: str, dest: str,
         min_running_seconds: float = 0.0) -> dict:
  """Replaces ``dest`` with the snapshot of ``workdir`` / ``out``."""
  files = plan_files(workdir, out, min_running_seconds)
  if not files:
    raise ValueError(f"nothing to snapshot in {workdir!r} / {out!r}: is "
                     "that the build's --workdir / --out?")
  tmp = dest.rstrip("/") + ".tmp"
  shutil.rmtree(tmp, ignore_errors=True)
  for kind, src, rel in files:
    dst = os.path.join(tmp, rel)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    if kind == "pack":
      pack_npz(src, dst)
    else:
      shutil.copyfile(src, dst)
  manifest = dict(files={rel: kind for kind, _, rel in files},
                  bytes=sum(os.path.getsize(os.path.join(tmp, rel))
                            for _, _, rel in files))
  with open(os.path.join(tmp, MANIFEST), "w") as f:
    json.dump(manifest, f, indent=1)
  shutil.rmtree(dest, ignore_errors=True)
  os.replace(tmp, dest)
  return manifest


def restore(workdir: str, out: str, dest: str) -> dict:
  """Writes the snapshot in ``dest`` into ``workdir`` / ``out``.

  Refuses to overwrite a file that exists (a live build's state): restore
  into fresh directories.
  """
  path = os.path.join(dest, MANIFEST)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{path} not found: {dest!r} is not a snapshot "
                            "written by 'save'")
  with open(path) as f:
    manifest = json.load(f)
  roots = {"workdir": workdir, "out": out}
  targets = []
  for rel, kind in manifest["files"].items():
    root, sub = rel.split("/", 1)
    targets.append((kind, os.path.join(dest, rel),
                    os.path.join(roots[root], sub)))
  clash = [t for _, _, t in targets if os.path.exists(t)]
  if clash:
    raise FileExistsError(f"{clash[0]} exists ({len(clash)} files would be "
                          "overwritten): restore into an empty --workdir and "
                          "--out")
  for kind, src, dst in targets:
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    if kind == "pack":
      unpack_npz(src, dst)
    else:
      shutil.copyfile(src, dst)
  return manifest


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("action", choices=("save", "restore"))
  ap.add_argument("--workdir", required=True)
  ap.add_argument("--out", required=True)
  ap.add_argument("--dest", required=True,
                  help="snapshot directory (outside the repository)")
  ap.add_argument("--min_running_minutes", type=float, default=20.0,
                  help="save: keep a stage in progress only once it has "
                  "trained this long (shorter ones are redone)")
  args = ap.parse_args()
  if args.action == "save":
    manifest = save(args.workdir, args.out, args.dest,
                    60 * args.min_running_minutes)
  else:
    manifest = restore(args.workdir, args.out, args.dest)
  print(f"{args.action}: {len(manifest['files'])} files, "
        f"{manifest['bytes'] / 2**20:.1f} MiB in {args.dest}")


if __name__ == "__main__":
  main()
