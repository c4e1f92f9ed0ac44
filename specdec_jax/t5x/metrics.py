"""A seqio metric of the speculative Models' aux outputs.

Add :func:`speculative_metrics` to a seqio Task's ``metric_fns``; seqio calls
it with the per-example aux values of ``predict_batch_with_aux``
(``specdec_jax.t5x.models``) and t5x's eval logs the result next to the
task's quality metrics::

    seqio.TaskRegistry.add(..., metric_fns=[metrics.bleu,
                                            speculative_metrics])

The same task can be evaluated with a stock t5x model (a baseline run): its
aux outputs hold no speculative statistics, and the metric then returns no
values (an empty dict) instead of failing.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence

import numpy as np

_KEYS = ("tokens", "drafted", "accepted", "verifier_calls", "drafter_calls",
         "deferrals")


def _ratio(num: float, den: float) -> float:
  return float(num / den) if den else float("nan")


def speculative_metrics(targets: Sequence[Any], predictions: Sequence[Any],
                        aux_values: Mapping[str, Sequence[Any]]
                        ) -> dict[str, float]:
  """Acceptance and cost statistics over the evaluated examples.

  Args:
    targets: unused (seqio passes them).
    predictions: unused.
    aux_values: per-example lists of 'tokens', 'drafted', 'accepted',
      'verifier_calls', 'drafter_calls', 'deferrals'.

  Returns:
    {'acceptance_rate': accepted / drafted, 'block_efficiency': tokens per
    verifier call, 'deferral_rate': deferral mass per token,
    'verifier_calls_per_example', 'drafter_calls_per_example',
    'tokens_per_example'} (nan where a denominator is 0); {} when the aux
    values hold none of these statistics (a stock t5x model, e.g. a
    baseline evaluated on the same task).

  Raises:
    ValueError when only some of the statistics are present (the aux values
    were mixed up or cut).
  """
  del targets, predictions
  aux_values = aux_values or {}
  missing = [k for k in _KEYS if k not in aux_values]
  if len(missing) == len(_KEYS):
    logging.info("speculative_metrics: the model returned no speculative aux "
                 "values (got %s); skipped (a stock t5x model?)",
                 sorted(aux_values))
    return {}
  if missing:
    raise ValueError(f"aux_values lack {missing}: speculative_metrics reads "
                     f"the aux outputs of specdec_jax.t5x.models")
  tot = {k: float(np.sum(np.asarray(aux_values[k], np.float64)))
         for k in _KEYS}
  n = len(aux_values["tokens"])
  return {
      "acceptance_rate": _ratio(tot["accepted"], tot["drafted"]),
      "block_efficiency": _ratio(tot["tokens"], tot["verifier_calls"]),
      "deferral_rate": _ratio(tot["deferrals"], tot["tokens"]),
      "verifier_calls_per_example": _ratio(tot["verifier_calls"], n),
      "drafter_calls_per_example": _ratio(tot["drafter_calls"], n),
      "tokens_per_example": _ratio(tot["tokens"], n),
  }
