"""gin-configurable specs of the modes other than decode (``main.run``).

Split from ``main.py`` (the entry point, which imports it so gin knows
them): 'plan', 'plan-tree', 'plan-hierarchy', 'eval' / 'bench', 'main' and
'serve' and 'tune', each a ``*_spec`` configurable that ``run`` calls
(and ``auto_args``, the row of ``run.strategy = 'auto'``).
"""

from __future__ import annotations

import os

import gin

from specdec_jax import decoding, models, runs
from specdec_jax.cli_usage import GIN_DIR


@gin.configurable
def plan_spec(topologies=("v4-8", "v4-16", "v4-32"), batches=(1, 8, 32),
              dtype: str = "bfloat16", output_dir: str | None = None):
  """The memory plan (mode 'plan'): per-chip bytes on TPU v4 slices."""
  from specdec_jax import plan  # pylint: disable=g-import-not-at-top
  rows = plan.memory_plan(topologies=tuple(topologies),
                          batches=tuple(batches), dtype=dtype)
  table = plan.format_plan(rows)
  print(table)
  if output_dir and runs.is_writer():
    os.makedirs(output_dir, exist_ok=True)
    with open(os.path.join(output_dir, "memory_plan.md"), "w") as f:
      f.write(table + "\n")
  return rows


@gin.configurable
def plan_tree_spec(drafter=None, verifier=None, method=None, sampling=None,
                   proposal: str = "without_replacement",
                   max_nodes: int = 32, max_depth: int = 8,
                   children: int = 8, batch_size: int = 1,
                   input_file: str | None = None, num_prompts: int = 8,
                   new_tokens: int = 32, output: str | None = None,
                   seed: int = 0):
  """Mode 'plan-tree': calibrate, time, plan a tree, write its gin file.

  Per-rank acceptance of the method's target at ``sampling`` is calibrated
  on ``num_prompts`` requests (``input_file`` in the decode format, or the
  pair's built-in test examples, or random prompts for random models);
  drafter / verifier block costs are timed at ``batch_size``; the plan
  (docs/trees.md) is printed and written to ``output`` as a gin file that
  decode runs include.
  """
  from specdec_jax import plan_tree_run as plan_tree_lib  # pylint: disable=g-import-not-at-top
  if drafter is None or verifier is None:
    raise ValueError("plan-tree needs a drafter and a verifier: include a "
                     "gin/pairs/*.gin file")
  return plan_tree_lib.run_plan_tree(
      drafter, verifier, method or decoding.make_method("spec_decode"),
      sampling or decoding.Greedy(), proposal=proposal, max_nodes=max_nodes,
      max_depth=max_depth, children=children, batch_size=batch_size,
      input_file=input_file, num_prompts=num_prompts, new_tokens=new_tokens,
      output=output if runs.is_writer() else None, seed=seed)


@gin.configurable
def plan_hierarchy_spec(verifier=None, candidates=None, sampling=None,
                        max_buffer: int = 8, max_depth: int | None = 3,
                        planner: str = "auto", batch_size: int = 1,
                        input_file: str | None = None, num_prompts: int = 8,
                        new_tokens: int = 32, repeats: int = 5,
                        top: int = 5, output: str | None = None,
                        seed: int = 0):
  """Mode 'plan-hierarchy': calibrate candidates, plan, write a gin file.

  ``candidates`` ({name: level} or [level]; a level is a ModelSpec or
  ``'exit:K'``) are calibrated under ``verifier``: pairwise alpha from one
  teacher-forced pass on ``num_prompts`` requests (``input_file``, the
  pair's built-in examples, or random prompts for random models) and per-
  call costs timed at ``batch_size``; the planner's best hierarchies are
  printed and the chosen one written to ``output`` (docs/hierarchy.md).
  """
  from specdec_jax import plan_hierarchy_run as plan_hierarchy  # pylint: disable=g-import-not-at-top
  if verifier is None:
    raise ValueError("plan-hierarchy needs a verifier: include a "
                     "gin/pairs/*.gin file")
  return plan_hierarchy.run_plan_hierarchy(
      verifier, candidates, sampling or decoding.Greedy(),
      max_buffer=max_buffer, max_depth=max_depth, planner=planner,
      batch_size=batch_size, input_file=input_file, num_prompts=num_prompts,
      new_tokens=new_tokens, repeats=repeats, top=top,
      output=output if runs.is_writer() else None, seed=seed)


@gin.configurable
def eval_spec(drafter=None, verifier=None, dataset: str = gin.REQUIRED,
              split: str = "test", num_examples: int | None = 100,
              metrics=("bleu",), sweep: str = "configs/sweeps.py:smoke",
              sweep_overrides=None, max_new_tokens: int = 64,
              inputs_key: str = "inputs", targets_key: str = "targets",
              output_dir: str | None = None, repeats: int = 1,
              bench: bool = False):
  """Modes 'eval' and 'bench': a sweep over a dataset, then the summary.

  ``sweep`` is an ml_collections config file with an optional name,
  ``configs/sweeps.py:paper_t5`` (see configs/sweeps.py); ``bench`` times
  every call 3 times and keeps the fastest. The sweep's values are validated
  before the models load.
  """
  cfg = _load_sweep(sweep)
  if sweep_overrides:
    cfg.update(dict(sweep_overrides))
  if max_new_tokens and "max_new_tokens" not in (sweep_overrides or {}):
    cfg.max_new_tokens = max_new_tokens
  if num_examples is not None and (isinstance(num_examples, bool) or
                                   not isinstance(num_examples, int) or
                                   num_examples < 1):
    raise ValueError(f"num_examples must be an integer >= 1 or None, got "
                     f"{num_examples!r}")
  runs.sweep_configs(cfg.to_dict())  # knobs checked before anything loads
  pair = runs.load_pair(drafter, verifier, metrics, cfg.max_new_tokens)
  family_extra = models.families.of_model(pair.verifier).extra_ids
  examples = runs.load_examples(
      dataset, split, num_examples or cfg.num_examples, inputs_key,
      targets_key, vocabulary=verifier.tokenizer, extra_ids=family_extra)
  out = output_dir or os.path.join("results", "bench" if bench else "eval")
  return runs.run_eval(pair, examples, cfg.to_dict(), out,
                       repeats=3 if bench else repeats)


def _load_sweep(spec: str):
  """'path/to/file.py[:name]' -> the ml_collections ConfigDict."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  path, _, name = spec.partition(":")
  if not os.path.isabs(path) and not os.path.isfile(path):
    path = os.path.join(os.path.dirname(GIN_DIR), path)
  if not os.path.isfile(path):
    raise ValueError(f"sweep config file not found: {spec}")
  module_spec = importlib.util.spec_from_file_location("_sweep", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(name) if name else module.get_config()


@gin.configurable
def main_job_spec(output_dir: str = "results/main_job", pairs=None,
                  num_examples: int | None = None, auto: bool = True,
                  auto_latency_budget: float = 0.8, auto_reuse: bool = True):
  """Mode 'main': every method on the built-in default pairs (the README's
  first command); see specdec_jax/eval/main_job.py. ``auto``: the 'auto'
  and 'auto (quality budget)' rows per pair (a short tune on the dev split
  first, eval/auto_rows.py), the latter within ``auto_latency_budget``;
  ``auto_reuse``: read tuned tables back from a resumed job or the user
  cache (False, ``--retune``: tune again)."""
  from specdec_jax.eval import auto_rows, main_job  # pylint: disable=g-import-not-at-top
  kw = {} if num_examples is None else {"num_examples": num_examples}
  return main_job.run_main_job(
      output_dir, pairs=pairs, auto=bool(auto),
      auto_settings=auto_rows.AutoSettings(
          latency_budget=auto_latency_budget, reuse=bool(auto_reuse)), **kw)


@gin.configurable
def serve_spec(drafter=None, verifier=None, medium=None,
               host: str = "127.0.0.1", port: int = 8000, slots: int = 4,
               max_prompt: int = 256, max_tokens: int = 128, steps: int = 2,
               speculation: str = "chain", gamma: int = 4,
               max_queue: int = 64, request_timeout_s: float = 120.0,
               max_pools: int = 4):
  """Mode 'serve' (gin/runs/serve.gin): the HTTP server (docs/serving.md).

  Without gin files it serves the built-in Gemma completion pair (drafter,
  medium and verifier, so hierarchies are available too).
  """
  from specdec_jax.serving import cli as serve_cli  # pylint: disable=g-import-not-at-top
  if drafter is None and verifier is None:
    drafter, medium, verifier = (
        runs.ModelSpec(default_pair="gemma_completion", role=r)
        for r in ("drafter", "medium", "verifier"))
  if drafter is None or verifier is None:
    raise ValueError("serve needs both a drafter and a verifier (a "
                     "gin/pairs/*.gin file), or neither (built-in pair)")
  return serve_cli.serve_models(
      [s for s in (drafter, medium, verifier) if s is not None], host=host,
      port=port, slots=slots, max_prompt=max_prompt, max_tokens=max_tokens,
      steps=steps, speculation=speculation, gamma=gamma, max_queue=max_queue,
      request_timeout_s=request_timeout_s, max_pools=max_pools)


@gin.configurable
def tune_spec(drafter=None, verifier=None, objective: str = "latency",
              latency_budget=None, quality_floor=None,
              temperature: float = 0.0, batch_sizes=(1, 8),
              gammas=(1, 2, 3, 4, 5, 6, 7, 8), trees=((2, 2), (2, 3)),
              input_file: str | None = None, num_prompts: int = 4,
              new_tokens: int = 16, repeats: int = 3, prune=3,
              price: bool = True, output: str | None = None, seed: int = 0,
              reuse: bool = True):
  """Mode 'tune' (gin/runs/tune.gin): measure target-only, chains, trees
  (and cascades for objective 'quality') per batch size, choose one per
  objective, write the auto strategy file (specdec_jax/tune_run.py); with
  ``reuse`` a table of the user cache with the same key is read back
  instead (False, ``--retune``: tune again)."""
  from specdec_jax import tune_run  # pylint: disable=g-import-not-at-top
  if drafter is None or verifier is None:
    raise ValueError("tune needs a drafter and a verifier: include a "
                     "gin/pairs/*.gin file")
  return tune_run.run_tune(
      drafter, verifier, objective=objective, latency_budget=latency_budget,
      quality_floor=quality_floor, temperature=temperature,
      batch_sizes=batch_sizes, gammas=gammas, trees=trees,
      input_file=input_file, num_prompts=num_prompts, new_tokens=new_tokens,
      repeats=repeats, prune=prune, price=price,
      output=output if runs.is_writer() else None, seed=seed,
      reuse=bool(reuse))


def auto_args(tune_file, drafter, verifier, sampling, batch_size):
  """(method, gamma, tree) of ``run.strategy = 'auto'``: the tune file's
  row for the run's batch size, or a quick calibration when no file."""
  from specdec_jax import tune_run  # pylint: disable=g-import-not-at-top
  from specdec_jax.decoding.planners import auto  # pylint: disable=g-import-not-at-top
  if tune_file is None:
    if drafter is None or verifier is None:
      raise ValueError("run.strategy = 'auto' without run.tune_file "
                       "calibrates the pair: include a gin/pairs/*.gin file")
    table = tune_run.run_tune(
        drafter, verifier, batch_sizes=(batch_size,),
        temperature=float(getattr(sampling, "temperature", 0.0) or 0.0),
        quiet=True)
  else:
    table = auto.load(tune_file)
  return tune_run.structure_of(table, batch_size)
