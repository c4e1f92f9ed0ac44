"""Where the main job's auto tables are read back from (no re-tune).

* ``<out_dir>/auto_<pair>_<objective>.gin``: a resumed job's own files
  (:func:`resumed`);
* the per-user program store (``decoding/planners/tune_store.py``, on
  when the CLI turns ``program_cache`` on): a second job with a fresh
  output directory, same models, examples, settings and machine
  (:func:`store_keys`, :func:`read_back`). ``--retune``
  (``AutoSettings.reuse = False``) tunes again and replaces both.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Callable, Mapping, Sequence

from specdec_jax.decoding.planners import auto as auto_lib
from specdec_jax.decoding.planners import tune_store
from specdec_jax.eval import drafts

_TUNED = re.compile(r"tuned in ([0-9.]+) s")


def resumed(path: str, batch: int, temperature: float):
  """(table, tune seconds) of a file a resumed job can reuse, else None."""
  if not os.path.exists(path):
    return None
  table = auto_lib.load(path)
  if table.temperature != temperature or batch not in table.batches:
    return None
  with open(path) as f:
    m = _TUNED.search(f.read())
  return table, float(m.group(1)) if m else 0.0


def store_keys(pair, settings, rows, split: str, objectives: Sequence[str],
               **job) -> dict[str, str]:
  """{objective: the user-store key of its table}.

  Args:
    pair: the pair (its name; ``drafts.pair_levels``: its models).
    settings: the ``AutoSettings`` (every field but ``reuse``).
    rows: the calibration examples' encoded token rows (hashed).
    split: the split they came from.
    objectives: the objectives to key.
    **job: the job's values the tune depends on (temperature, top_p,
      gamma, max_new_tokens, batch_size, seed, stack, alphas).

  Returns:
    Keys that change with any of these and with the models' parameters
    (``tune_store.models_fingerprint``).
  """
  levels = drafts.pair_levels(pair)
  base = dict(
      pair=pair.name, split=split, rows=tune_store.rows_fingerprint(rows),
      settings={k: v for k, v in dataclasses.asdict(settings).items()
                if k != "reuse"},
      models=tune_store.models_fingerprint([m for m, _ in levels],
                                           [p for _, p in levels]), **job)
  return {o: tune_store.key_of(objective=o, **base) for o in objectives}


def read_back(pair, settings, rows, split: str, objectives: Sequence[str],
              job: Mapping, labels: Mapping[str, str],
              paths: Mapping[str, str], say: Callable[[str], None]
              ) -> tuple[dict[str, str], dict[str, tune_store.Stored]]:
  """The user-store keys of ``objectives`` and the tables found under them
  (none when ``settings.reuse`` is off), each found one written to its
  out_dir file (``paths``) as a tuned one is.

  Args:
    pair, settings, rows, split, objectives: as in :func:`store_keys`.
    job: :func:`store_keys`' ``**job`` (its batch_size and temperature
      must be among a stored table's).
    labels: {objective: its row label}.
    paths: {objective: the table's file in the job's directory}.
    say: progress lines.

  Returns:
    ({objective: key}, {objective: Stored}).
  """
  keys = store_keys(pair, settings, rows, split, objectives, **job)
  found = {}
  for objective, key in keys.items():
    got = settings.reuse and tune_store.lookup(
        key, objective=objective, batch_sizes=(job["batch_size"],),
        temperature=job["temperature"])
    if not got:
      continue
    got.table.save(paths[objective], note=(
        f"main job {labels[objective]!r} row of {pair.name}: read back from "
        f"the user cache ({got.describe()}) on {settings.num_examples} "
        f"{split} examples"))
    say(f"[{pair.name}] {labels[objective]}: reused the tuned table from "
        f"the user cache (tuned in {got.tune_s:.1f} s)")
    found[objective] = got
  return keys, found


__all__ = ["read_back", "resumed", "store_keys"]
