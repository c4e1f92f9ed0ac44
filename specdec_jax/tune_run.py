"""``specdec_jax tune``: choose how to decode a pair on this machine.

Loads the pair and a few calibration requests, runs ``decoding.planners.
tune`` (every candidate decoded and timed back to back against target-only
at each batch size; docs in ``decoding/planners/tuning.py``), prints the
table (choice per batch size and every candidate's measured / predicted
tokens/s) and writes the auto strategy file that ``decode`` runs with
``run.strategy = 'auto'`` and ``run.tune_file`` (``decoding.decode('auto',
..., tune=path)`` in Python). With the per-user store on (the CLI's
``program_cache``) the table is kept there, keyed by the models'
parameters, the calibration rows, every setting and the machine
(``decoding/planners/tune_store.py``): a second identical tune reads it
back instead of timing again; ``reuse=False`` (``--retune``) tunes again.
"""

from __future__ import annotations

import time
from typing import Sequence

from specdec_jax import plan_tree_run, program_cache
from specdec_jax.decoding import planners
from specdec_jax.decoding.planners import auto as auto_lib
from specdec_jax.decoding.planners import tune_store


def _ints(name: str, values, low: int = 1) -> tuple[int, ...]:
  values = tuple(values or ())
  for x in values:
    if isinstance(x, bool) or not isinstance(x, int) or x < low:
      raise ValueError(f"{name} must be integers >= {low}, got "
                       f"{list(values)}")
  return values


def format_table(table: auto_lib.AutoTable) -> str:
  """Every candidate per batch size (markdown); the choice is marked."""
  lines = [f"objective: {table.objective}"
           + (f", latency budget {table.latency_budget}"
              if table.latency_budget is not None else "")
           + (f", quality floor {table.quality_floor}"
              if table.quality_floor is not None else "")
           + f"; temperature {table.temperature}", "",
           "| batch | candidate | tokens/s | x target-only | predicted "
           "tokens/s | quality | chosen |", "|---|---|---|---|---|---|---|"]
  for r in table.rows:
    for m in sorted(r.candidates, key=lambda m: -m.ratio):
      pred = "-" if m.predicted_tps is None else f"{m.predicted_tps:.1f}"
      qual = "-" if m.quality is None else f"{m.quality:.3f}"
      mark = "<-" if m.candidate == r.choice.candidate else ""
      lines.append(f"| {r.batch} | {m.candidate.label} | {m.tps:.1f} | "
                   f"{m.ratio:.3f} | {pred} | {qual} | {mark} |")
  return "\n".join(lines)


def store_key(models, params, prompts, inputs, **settings) -> str | None:
  """The user-store key of a tune: the models' parameters, the calibration
  rows (hashed) and every setting; None when the store is off."""
  if program_cache.directory() is None:
    return None
  rows = inputs if inputs is not None else prompts
  return tune_store.key_of(
      models=tune_store.models_fingerprint(models, params),
      rows=tune_store.rows_fingerprint(rows),
      encoder_decoder=inputs is not None, **settings)


def run_tune(drafter, verifier, *, objective: str = "latency",
             latency_budget: float | None = None,
             quality_floor: float | None = None, temperature: float = 0.0,
             batch_sizes: Sequence[int] = (1, 8),
             gammas: Sequence[int] = range(1, 9),
             trees: Sequence = planners.tuning.TREES,
             cascades: Sequence = planners.tuning.CASCADES,
             input_file: str | None = None, num_prompts: int = 4,
             new_tokens: int = 16, repeats: int = 3, prune: int | None = 3,
             price: bool = True, output: str | None = None, seed: int = 0,
             quiet: bool = False, reuse: bool = True) -> auto_lib.AutoTable:
  """Tunes the pair (``runs.ModelSpec``s); prints and writes the table.

  Settings are checked before any model loads. With the user store on, a
  table tuned before with the same key is read back (``reuse=False``: tune
  again and replace it).

  Returns:
    The AutoTable (written to ``output`` when set).
  """
  auto_lib.check_objective(objective, latency_budget, quality_floor)
  batch_sizes = _ints("batch_sizes", batch_sizes)
  gammas = _ints("gammas", gammas)
  if not batch_sizes:
    raise ValueError("batch_sizes is empty: give the batch sizes to tune, "
                     "e.g. BATCH_SIZES = [1, 8]")
  trees = [tuple(t) for t in (trees or ())]
  for t in trees:
    if len(t) != 2:
      raise ValueError(f"trees are (k, depth) pairs (a full k-ary tree), "
                       f"got {list(t)}")
  if not gammas and not trees:
    raise ValueError("the candidate list is empty: give GAMMAS and/or TREES")
  for name, x in (("num_prompts", num_prompts), ("new_tokens", new_tokens),
                  ("repeats", repeats)):
    _ints(name, [x])
  if temperature < 0:
    raise ValueError(f"temperature must be >= 0, got {temperature!r}")
  plan_tree_run.check_output(output)
  t0 = time.perf_counter()
  (d, v, qp, pp), prompts, inputs = plan_tree_run.calibration_requests(
      drafter, verifier, input_file, num_prompts, seed)
  say = (lambda _: None) if quiet else print
  settings = dict(
      objective=objective, latency_budget=latency_budget,
      quality_floor=quality_floor, temperature=temperature,
      batch_sizes=batch_sizes, gammas=gammas, trees=trees,
      cascades=cascades, new_tokens=new_tokens, repeats=repeats,
      prune=prune, price=price, seed=seed)
  key = store_key([d, v], [qp, pp], prompts, inputs, **settings)
  got = reuse and key and tune_store.lookup(
      key, objective=objective, batch_sizes=batch_sizes,
      temperature=temperature)
  table = got.table if got else planners.tune(
      [d, v], [qp, pp], prompts, inputs=inputs, progress=say, **settings)
  say(format_table(table))
  if got:
    say(f"reused the tuned table from the user cache ({got.describe()}; "
        f"--retune tunes again)")
  else:
    say(f"tuned in {time.perf_counter() - t0:.1f} s")
    if key:
      tune_store.keep(key, table, time.perf_counter() - t0, "specdec_jax tune")
  if output:
    table.save(output, note=(
        f"Written by `specdec_jax tune` (objective {objective}, "
        f"temperature {temperature}, {num_prompts} prompts x {new_tokens} "
        f"tokens). Decode with it:\n  specdec_jax decode --gin_file="
        f"runs/decode.gin --gin_file=<pair>.gin --gin.run.strategy=\"'auto'"
        f"\" --gin.run.tune_file=\"'{output}'\""))
    say(f"wrote {output}")
  return table


def structure_of(table: auto_lib.AutoTable, batch_size: int):
  """(method, gamma, tree) of the CLI decode for ``batch_size`` (the row
  rule of ``AutoTable.row_for``); a hierarchy row is refused."""
  from specdec_jax import decoding  # pylint: disable=g-import-not-at-top
  name, knobs, gamma, tree = table.pair_choice(batch_size)
  return decoding.make_method(name, **knobs), gamma, tree


__all__ = ["format_table", "run_tune", "store_key", "structure_of"]
