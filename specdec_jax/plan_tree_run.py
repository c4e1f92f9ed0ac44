"""``specdec_jax plan-tree``: plan a draft tree for a pair on this machine.

Loads the pair, calibrates the per-rank acceptance of the method's target
(``decoding.planners.calibrate``), times drafter and verifier block steps
(``measure_costs``), runs the hardware-aware Sequoia planner
(``plan_tree``), prints the shape with its predicted tokens per verifier
call and speedup, and writes a gin file that decode runs include
(``tree_spec`` in main.py; docs/trees.md).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from specdec_jax import decoding
from specdec_jax.decoding import inputs as inputs_lib
from specdec_jax.decoding import planners
from specdec_jax.decoding.planners import tree_shape


def calibration_requests(drafter, verifier, input_file, num_prompts: int,
                         seed: int):
  """(d_model, v_model, q_params, p_params, prompts, inputs) of the run."""
  if verifier.default_pair:
    from specdec_jax.eval import default_models  # pylint: disable=g-import-not-at-top
    pair = default_models.load(verifier.default_pair, dtype=verifier.dtype)
    rows = pair.encode(default_models.examples(pair.name, "test",
                                               num_prompts))
    models = (pair.drafter, pair.verifier, pair.q_params, pair.p_params)
    prompts, inputs = rows.get("prompts"), rows.get("inputs")
  else:
    v_model, p_params, _ = verifier.load()
    d_model, q_params, _ = drafter.load(v_model)
    models = (d_model, v_model, q_params, p_params)
    rng = np.random.default_rng(seed)
    rows = [list(rng.integers(2, v_model.vocab_size, size=8))
            for _ in range(num_prompts)]
    prompts, inputs = (None, rows) if v_model.is_encoder_decoder else (
        rows, None)
  if input_file:
    ids, enc = request_rows(input_file, drafter, verifier, num_prompts)
    prompts, inputs = (None, ids) if enc else (ids, None)
  return models, prompts, inputs


def request_rows(input_file: str, drafter, verifier, num_prompts: int):
  """The first ``num_prompts`` requests of a JSONL request file.

  Args:
    drafter: the drafter's ModelSpec, or None (only the verifier's
      vocabulary is checked then).
    verifier: the verifier's ModelSpec.

  Returns:
    (rows, encoder_decoder): [num_prompts] lists of token ids, and whether
    they are encoder inputs.

  Raises:
    ValueError naming the file when a request is bad or there is none.
  """
  from specdec_jax import decode_requests, model_spec  # pylint: disable=g-import-not-at-top
  _, _, vocab = model_spec.vocab_of(drafter, verifier, drafter is not None)
  good, failed = decode_requests.read_requests(input_file, vocab)
  if failed or not good:
    raise ValueError(f"{input_file}: {len(failed)} bad request(s) "
                     f"({failed[0] if failed else 'no requests'})")
  return [list(r.ids) for r in good[:num_prompts]], vocab.encoder_decoder


def format_plan(plan, acceptance, sync: str) -> str:
  """The printed report of a plan (markdown)."""
  t = plan.topology
  per_depth = [t.depths.count(k) for k in range(1, t.max_depth + 1)]
  lines = [
      f"per-rank acceptance a_j: {', '.join(f'{a:.3f}' for a in acceptance)}",
      f"chosen tree: {t.num_nodes} nodes, depth {t.max_depth}, at most "
      f"{t.max_children} children; nodes per depth {per_depth}",
      f"parents: {list(t.parents)}",
      f"drafter sync: {sync}",
      f"predicted tokens per verifier call: {plan.tokens_per_call:.3f}",
  ]
  if plan.predicted_speedup is not None:
    lines.append(f"predicted speedup over target-only: "
                 f"{plan.predicted_speedup:.2f}x "
                 f"({plan.seconds_per_call * 1e3:.3f} ms per block)")
    if plan.predicted_speedup < 1.0:
      lines.append("note: no tree is predicted to beat target-only decoding "
                   "with these models on this machine (the drafter is not "
                   "cheap enough next to the verifier)")
    best = sorted(plan.candidates, key=lambda r: r["seconds_per_token"])
    lines += ["", "| nodes | depth | children | tokens/call | speedup |",
              "|---|---|---|---|---|"]
    lines += [f"| {r['nodes']} | {r['depth']} | {r['children']} | "
              f"{r['tokens_per_call']:.3f} | {r['speedup']:.2f}x |"
              for r in best[:8]]
  return "\n".join(lines)


def check_output(output: str | None) -> None:
  """Refuses an OUTPUT that cannot be written, before any calibration."""
  if not output:
    return
  path = os.path.abspath(output)
  if os.path.isdir(path):
    raise ValueError(f"OUTPUT {path} is a directory; give a file path")
  probe = os.path.dirname(path)
  while not os.path.exists(probe):
    probe = os.path.dirname(probe)
  if not os.path.isdir(probe):
    raise ValueError(f"cannot write OUTPUT {path}: {probe} is a file, not a "
                     f"directory; choose another OUTPUT")
  target = path if os.path.exists(path) else probe
  if not os.access(target, os.W_OK):
    raise ValueError(f"cannot write OUTPUT {path}: {target} is not writable "
                     f"(check its permissions or choose another OUTPUT)")


class StageBar:
  """A progress bar (stderr) over a planner's stages.

  The searches themselves are bounded to seconds (``tree_shape.check_search``,
  ``hierarchy.planner.check_search``); what takes time is calibrating on the
  requests and timing the models, so the bar names the stage in progress.
  """

  def __init__(self, desc: str, stages: list[str]):
    from tqdm import tqdm  # pylint: disable=g-import-not-at-top
    self.stages, self.done = stages, 0
    self.bar = tqdm(total=len(stages), desc=desc, unit="stage",
                    file=sys.stderr)
    self.bar.set_postfix_str(stages[0])

  def next(self) -> None:
    """Marks the current stage done (and closes the bar after the last)."""
    self.done += 1
    self.bar.update()
    if self.done < len(self.stages):
      self.bar.set_postfix_str(self.stages[self.done])
    else:
      self.bar.close()


def run_plan_tree(drafter, verifier, method, sampling, *, proposal: str,
                  max_nodes: int, max_depth: int, children: int,
                  batch_size: int, input_file: str | None, num_prompts: int,
                  new_tokens: int, output: str | None, seed: int) -> dict:
  """Plans a tree for the pair (``runs.ModelSpec``s); returns the report.

  Returns:
    dict with 'acceptance', 'parents', 'tokens_per_call',
    'predicted_speedup', 'costs' and the 'gin' text written to ``output``.
  """
  if getattr(method, "trees", False) is not True:
    raise ValueError(f"plan-tree needs a speculative method that runs on "
                     f"trees, got {type(method).__name__}")
  decoding.Tree(decoding.Topology.chain(1), proposal)  # checks the kind
  for name, x in (("max_nodes", max_nodes), ("max_depth", max_depth),
                  ("children", children), ("num_prompts", num_prompts),
                  ("new_tokens", new_tokens), ("batch_size", batch_size)):
    if isinstance(x, bool) or not isinstance(x, int) or x < 1:
      raise ValueError(f"{name} must be an integer >= 1, got {x!r}")
  tree_shape.check_search(max_nodes, max_depth, 1, costed=True)
  inputs_lib.check_method(method, sampling or decoding.Greedy())
  check_output(output)
  bar = StageBar("plan-tree", ["loading the models", "calibrating "
                 "acceptance", "timing the models", "planning"])
  (d, v, qp, pp), prompts, inputs = calibration_requests(
      drafter, verifier, input_file, num_prompts, seed)
  bar.next()
  acceptance = planners.calibrate(
      method, d, v, qp, pp, prompts, inputs=inputs, sampling=sampling,
      proposal=proposal, children=children, new_tokens=new_tokens, seed=seed)
  bar.next()
  widths = [w for w in (1, 2, 4, 8, 16, 32, 64, 128) if w < max_nodes + 1]
  costs = planners.measure_costs(d, v, qp, pp, batch=batch_size,
                                 widths=widths + [max_nodes + 1])
  bar.next()
  sync = "commit" if method.target.needs_drafter_at_bonus else "catchup"
  plan = planners.plan_tree(acceptance, costs, max_nodes, max_depth, sync)
  bar.next()
  note = (f"Planned by `specdec_jax plan-tree` for {method!r}, sampling "
          f"{sampling!r}, batch {batch_size}: predicted "
          f"{plan.tokens_per_call:.2f} tokens per verifier call, "
          f"{plan.predicted_speedup:.2f}x over target-only on this machine.")
  text = tree_shape.tree_gin(plan.topology, proposal, note)
  print(format_plan(plan, acceptance, sync))
  if output:
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    with open(output, "w") as f:
      f.write(text)
    print(f"wrote {output}")
  return dict(acceptance=list(acceptance), parents=list(plan.topology.parents),
              tokens_per_call=plan.tokens_per_call,
              predicted_speedup=plan.predicted_speedup,
              costs=json.loads(json.dumps(costs.__dict__)), gin=text)
