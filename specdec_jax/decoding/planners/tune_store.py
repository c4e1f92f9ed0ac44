"""Tuned auto tables kept in the per-user program store (issue 39).

``planners.tune`` times candidates for minutes, and its table depends on
the models, the calibration rows, the settings and the machine. With the
program store on (``program_cache.enable``: the CLI turns it on beside the
compilation cache; library calls leave it off) a caller keeps the table it
tuned under ``<store>/auto_table-<hash>.json`` (:func:`keep`) and a later
run with the same key reads it back instead of timing again
(:func:`lookup`): ``specdec_jax main`` (``eval/auto_rows.py``) and
``specdec_jax tune`` (``tune_run.py``).

The key is the caller's (:func:`key_of`: every setting of the tune, a hash
of the calibration rows, :func:`models_fingerprint` of the models) joined
by ``program_cache`` with its fingerprint (JAX / jaxlib versions, backend,
host CPU, specdec_jax's own sources), so another machine, another JAX or
an edited source file times again. An unreadable or corrupt entry is a
miss (tuned again, then overwritten).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import platform
import time
from typing import Any, Sequence

import jax
import numpy as np

from specdec_jax import program_cache
from specdec_jax.decoding.planners.auto import AutoTable

KIND = "auto_table"


def params_fingerprint(params) -> str:
  """sha256 of a parameter pytree: every leaf's path, shape, dtype and
  bytes (all of them: measured 35 ms for the three models of the built-in
  T5 pair, 56 MB of float32; 15 ms for the Gemma pair's 24 MB)."""
  digest = hashlib.sha256()
  leaves = jax.tree_util.tree_flatten_with_path(params)[0]
  for path, leaf in leaves:
    a = np.ascontiguousarray(np.asarray(leaf))
    digest.update(f"{jax.tree_util.keystr(path)}|{a.shape}|{a.dtype}"
                  .encode())
    digest.update(a.view(np.uint8).reshape(-1).data if a.size else b"")
  return digest.hexdigest()


def model_name(model) -> str:
  """A model's repr when it is the same in every process (a Flax module
  prints its config), else its class."""
  return program_cache.stable_repr(model) or (
      f"{type(model).__module__}.{type(model).__qualname__}")


def models_fingerprint(models: Sequence, params: Sequence) -> list[str]:
  """['<model>|<params sha256>'] per level (None models: their class)."""
  return [f"{model_name(m)}|{params_fingerprint(p)}"
          for m, p in zip(models, params)]


def rows_fingerprint(rows) -> str:
  """sha256 of ragged token rows (calibration prompts or inputs)."""
  digest = hashlib.sha256()
  for row in rows:
    digest.update(np.asarray(row, np.int64).tobytes() + b"|")
  return digest.hexdigest()


def key_of(**parts: Any) -> str:
  """A deterministic key of plain values (tuples become lists)."""
  return json.dumps(parts, sort_keys=True, default=str)


@dataclasses.dataclass(frozen=True)
class Stored:
  """A table read back from the store.

  Attributes:
    table: the AutoTable.
    tune_s: seconds its tune took.
    tuned_at: when it was tuned (UTC, 'YYYY-MM-DD HH:MM:SS').
    where: what tuned it (e.g. the main job's output directory).
  """

  table: AutoTable
  tune_s: float
  tuned_at: str
  where: str

  def describe(self) -> str:
    """'tuned in 61.2 s, 2026-11-28 13:00:00 UTC, results/main_job'."""
    return ", ".join([f"tuned in {self.tune_s:.1f} s"] + [
        x for x in (self.tuned_at and f"{self.tuned_at} UTC", self.where)
        if x])


def lookup(key: str, *, objective: str, batch_sizes: Sequence[int],
           temperature: float) -> Stored | None:
  """The table stored under ``key`` if it fits (its objective, every batch
  size tuned, its temperature), else None (store off, no entry, a corrupt
  one)."""
  value = program_cache.load_value(KIND, key)
  if not isinstance(value, dict):
    return None
  try:
    table = AutoTable.from_gin(value["gin"], "the user cache")
    got = Stored(table, float(value["tune_s"]),
                 str(value.get("tuned_at", "")), str(value.get("where", "")))
  except (KeyError, TypeError, ValueError, AttributeError):
    return None
  if (table.objective != objective
      or table.temperature != float(temperature)
      or not set(int(b) for b in batch_sizes) <= set(table.batches)):
    return None
  return got


def keep(key: str, table: AutoTable, tune_s: float, where: str = "") -> None:
  """Stores ``table`` under ``key`` (nothing when the store is off)."""
  program_cache.save_value(KIND, key, dict(
      gin=table.to_gin(), tune_s=float(tune_s),
      tuned_at=time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
      where=f"{where} on {platform.node()}" if where else platform.node()))


__all__ = ["KIND", "Stored", "keep", "key_of", "lookup", "model_name",
           "models_fingerprint", "params_fingerprint", "rows_fingerprint"]
