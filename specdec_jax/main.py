r"""The specdec_jax command line (absl flags + gin), t5x style.

    python -m specdec_jax.main --gin_file=runs/decode.gin \
        --gin_file=pairs/default_t5_codegen.gin \
        --gin_file=methods/token_v3.gin \
        --gin.INPUT_FILE="'prompts.jsonl'" --gin.ALPHA=0.4

Flags: --gin_file (repeatable; resolved against --gin_search_paths and the
shipped gin/ directory), --gin_bindings / --gin.KEY=VALUE (repeatable),
--gin_search_paths (comma separated), --mode (decode | eval | bench | plan |
plan-tree | plan-hierarchy | main; overrides ``run.mode``), --num_examples,
--verify=CHECKPOINT, --compilation_cache_dir (every mode keeps compiled
programs in a per-user persistent cache, ~/.cache/specdec_jax/jax_cache by
default, so a second run answers without compiling; '' turns it off).
``specdec_jax``, ``specdec_jax help``, ``--help`` and ``--helpfull`` print
the usage (:func:`usage`). This module holds the only gin-configurable
wrappers of the code base; the library stays gin-free.

Errors in files, flags and bindings print one line and exit with status 2;
gin files and bindings are parsed strictly (``gin_checks.py``: unbalanced
brackets name the file and line, a macro nothing uses is a typo). On a TPU
pod slice it calls ``jax.distributed.initialize()`` first and only host 0
writes results.
"""

from __future__ import annotations

import glob
import inspect
import logging
import os
import re
import sys
import textwrap
from typing import Sequence

from absl import flags
import gin

from specdec_jax import decode_requests, decoding, gin_checks, program_cache
from specdec_jax import runs
from specdec_jax import hierarchy_spec as hierarchy_lib

GIN_DIR = os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "gin")
MODES = ("decode", "eval", "bench", "plan", "plan-tree", "plan-hierarchy",
         "main", "serve")
HELP_ARGS = ("--help", "-h", "-help", "--helpshort", "-?", "--helpfull",
             "-helpfull", "help")

_GIN_FILES = flags.DEFINE_multi_string(
    "gin_file", [], "gin files, in order (later ones override earlier).")
_GIN_BINDINGS = flags.DEFINE_multi_string(
    "gin_bindings", [], "gin bindings, e.g. \"ALPHA = 0.3\".")
_GIN_SEARCH_PATHS = flags.DEFINE_list(
    "gin_search_paths", [], "directories searched for gin files and includes.")
_MODE = flags.DEFINE_enum("mode", None, list(MODES),
                          "what to run (overrides run.mode).")
_NUM_EXAMPLES = flags.DEFINE_integer(
    "num_examples", None, "modes main / eval / bench: examples per pair or "
    "dataset (overrides NUM_EXAMPLES).", lower_bound=1)
_VERIFY = flags.DEFINE_multi_string(
    "verify", [], "check a checkpoint (any format) and exit: per-tensor "
    "checksums (when it has checksums.json), NaN/inf and statistics; "
    "repeatable.")
_COMPILATION_CACHE = flags.DEFINE_string(
    "compilation_cache_dir", None, "JAX's persistent compilation cache, so "
    "a second run loads compiled programs instead of compiling them again "
    "(default: $SPECDEC_JAX_COMPILATION_CACHE, else "
    "~/.cache/specdec_jax/jax_cache; '' turns it off).")
_DISTRIBUTED = flags.DEFINE_enum(
    "distributed", "auto", ["auto", "yes", "no"],
    "call jax.distributed.initialize() (auto: on multi-host TPU / when "
    "JAX_COORDINATOR_ADDRESS is set).")


# --------------------------------------------------------------------------
# gin-configurable wrappers (the only ones in the project)
# --------------------------------------------------------------------------

ModelSpec = gin.external_configurable(runs.ModelSpec, "ModelSpec")


def _method_spec(name: str = gin.REQUIRED, **knobs):
  """A decoding method by name with its knobs (see decoding.REGISTRY).

  The knobs are explicit parameters (the union of every registry row's
  knobs, generated below) so that gin rejects a misspelled one at parse
  time, naming the file and line; unset knobs keep the method's defaults.
  """
  return decoding.make_method(name, **{k: v for k, v in knobs.items()
                                       if v is not None})


_method_spec.__signature__ = inspect.Signature(
    [inspect.Parameter("name", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                       default=gin.REQUIRED)] +
    [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=None)
     for k in decoding.registry.KNOB_NAMES])
method_spec = gin.configurable("method_spec")(_method_spec)


@gin.configurable
def sampling_spec(temperature: float = 0.0, top_k=None, top_p=None):
  """The sampling transform: temperature (0 = greedy), top_k or top_p."""
  return runs.sampling_from(temperature, top_k, top_p)


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
def tree_spec(parents=None, paths=None, kary=None, chain=None,
              proposal: str = "without_replacement",
              drafter_sync: str = "auto"):
  """A draft tree (decode with tree verification; gin/trees/*.gin).

  Exactly one of: ``parents`` (parent index of every node, -1 = root,
  breadth-first), ``paths`` (child-rank paths, e.g. [[0], [1], [0, 0]]),
  ``kary`` ((k, depth): a full k-ary tree) or ``chain`` (gamma).
  """
  given = {k: v for k, v in dict(parents=parents, paths=paths, kary=kary,
                                   chain=chain).items() if v is not None}
  if len(given) != 1:
    raise ValueError(f"tree_spec needs exactly one of parents, paths, kary, "
                     f"chain; got {sorted(given) or 'none'}")
  (kind, value), = given.items()
  topo = {"parents": lambda x: decoding.Topology(tuple(x)),
          "paths": decoding.Topology.from_paths,
          "kary": lambda x: decoding.Topology.kary(*x),
          "chain": decoding.Topology.chain}[kind](value)
  return decoding.Tree(topo, proposal=proposal, drafter_sync=drafter_sync)


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
def hierarchy_spec(drafters=gin.REQUIRED, buffers=gin.REQUIRED, lenient=None):
  """A hierarchy under the run's verifier (decode; gin/hierarchies/*.gin).

  ``drafters``: levels 0..K-1, cheapest first, each a ModelSpec
  (``@scope/ModelSpec()``) or ``'exit:K'`` (the verifier's first K decoder
  layers); ``buffers``: [T_0, ..., T_{K-1}]; ``lenient``: optional
  {level n in 1..K-1: @scope/method_spec()} cascade rules of intermediate
  levels (the top method must then be spec_decode).
  """
  return hierarchy_lib.HierarchySpec(drafters, buffers, lenient or ())


# The draft structure as one value: ``run.strategy = @chain()``, ``@tree()``
# or ``@stack()`` (instead of run.gamma / run.tree / run.hierarchy).


@gin.configurable("chain")
def chain_strategy(gamma: int = 5):
  """A chain of ``gamma`` drafted tokens per block (decoding.Chain)."""
  return decoding.Chain(gamma)


@gin.configurable("tree")
def tree_strategy(parents=None, paths=None, kary=None, chain=None,
                  proposal: str = "without_replacement",
                  drafter_sync: str = "auto"):
  """A draft tree (decoding.Tree); the arguments of ``tree_spec``."""
  return tree_spec(parents=parents, paths=paths, kary=kary, chain=chain,
                   proposal=proposal, drafter_sync=drafter_sync)


@gin.configurable("stack")
def stack_strategy(drafters=gin.REQUIRED, buffers=gin.REQUIRED,
                   lenient=None):
  """A stack of drafters under the verifier; the arguments of
  ``hierarchy_spec`` (the levels' ModelSpecs are part of it)."""
  return hierarchy_spec(drafters=drafters, buffers=buffers, lenient=lenient)


def _structure_args(strategy, gamma: int, tree, hierarchy):
  """(gamma, tree, hierarchy) of ``run`` with ``run.strategy`` applied."""
  if strategy is None:
    return gamma, tree, hierarchy
  if tree is not None or hierarchy is not None:
    raise ValueError("set run.strategy OR run.tree / run.hierarchy, not "
                     "both (run.strategy = @chain(), @tree() or @stack())")
  if isinstance(strategy, decoding.Chain):
    return strategy.gamma, None, None
  if isinstance(strategy, decoding.Tree):
    return gamma, strategy, None
  if isinstance(strategy, hierarchy_lib.HierarchySpec):
    return gamma, None, strategy
  raise ValueError(f"run.strategy must be @chain(), @tree() or @stack(), "
                   f"got {type(strategy).__name__}")


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
def run(mode: str | None = None, drafter=None, verifier=None, method=None,
        sampling=None, gamma: int = 5, max_new_tokens: int = 64,
        batch_size: int = 8, input_file: str | None = None,
        output_dir: str | None = None, seed: int = 0, tree=None,
        hierarchy=None, strategy=None):
  """Runs one mode with the configured models and method.

  ``tree`` (a ``tree_spec()``, gin/trees/*.gin) makes decode verify draft
  trees instead of chains of ``gamma``; ``hierarchy`` (a
  ``hierarchy_spec()``, gin/hierarchies/*.gin) makes it decode with a stack
  of drafters under the verifier (hierarchical speculative decoding).
  ``strategy`` sets the draft structure as one value instead:
  ``@chain()``, ``@tree()`` or ``@stack()``.

  Mode 'decode' returns the rows (and raises
  ``decode_requests.RequestErrors`` after writing the good rows when some
  requests were invalid); the other modes return their results.
  """
  if mode not in MODES:
    raise ValueError(f"set --mode or run.mode to one of {', '.join(MODES)} "
                     f"(got {mode!r}); `specdec_jax --help` shows examples")
  gamma, tree, hierarchy = _structure_args(strategy, gamma, tree, hierarchy)
  if mode == "decode":
    if verifier is None:
      raise ValueError("decode needs a verifier: include gin files "
                       "runs/decode.gin and a pairs/*.gin (`specdec_jax "
                       "--help` shows an example)")
    method = method or decoding.make_method("spec_decode")
    out = os.path.join(output_dir, "decodes.jsonl") if output_dir else None
    extra = {k: v for k, v in (("tree", tree), ("hierarchy", hierarchy))
             if v is not None}
    report = runs.run_decode(drafter, verifier, method, sampling, gamma,
                             max_new_tokens, batch_size, input_file, out,
                             seed, **extra)
    summary = report.summary()
    print(runs.format_table(list(summary), [list(summary.values())]),
          file=sys.stderr)
    report.raise_for_failures()
    return report.rows
  if mode == "plan":
    return plan_spec()
  if mode == "plan-tree":
    return plan_tree_spec()
  if mode == "plan-hierarchy":
    return plan_hierarchy_spec()
  if mode == "main":
    return main_job_spec()
  if mode == "serve":
    return serve_spec()
  if drafter is None or verifier is None:
    raise ValueError(f"{mode} needs a drafter and a verifier: include a "
                     f"gin/pairs/*.gin file")
  return eval_spec(drafter=drafter, verifier=verifier,
                   max_new_tokens=max_new_tokens, output_dir=output_dir,
                   bench=mode == "bench")


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
  family_extra = 100 if pair.verifier.is_encoder_decoder else 0
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
                  num_examples: int | None = None):
  """Mode 'main': every method on the built-in default pairs (the README's
  first command); see specdec_jax/eval/main_job.py."""
  from specdec_jax.eval import main_job  # pylint: disable=g-import-not-at-top
  kw = {} if num_examples is None else {"num_examples": num_examples}
  return main_job.run_main_job(output_dir, pairs=pairs, **kw)


# --------------------------------------------------------------------------
# Usage
# --------------------------------------------------------------------------

_MODE_HELP = {
    "decode": "decode requests (JSONL or text lines; a file or stdin) into "
              "<OUTPUT_DIR>/decodes.jsonl (or stdout), streamed and "
              "resumable",
    "eval": "a sweep of methods / knobs / sampling on a dataset -> "
            "results.jsonl (resumable), summary.md, plots",
    "bench": "time target-only vs speculative methods over gamma (each call "
             "3x, fastest kept)",
    "plan": "per-chip memory of both models on TPU v4 slices (no weights "
            "needed)",
    "plan-tree": "calibrate per-rank acceptance, time the models, choose a "
                 "draft tree (Sequoia DP, hardware-aware) and write its gin "
                 "file for decode",
    "plan-hierarchy": "calibrate candidate drafters (models, early exits "
                      "of the verifier): pairwise alpha and per-call costs; "
                      "choose the hierarchy with the least predicted latency "
                      "per token and write its gin file for decode",
    "main": "every method on the built-in trained pairs: the README's first "
            "command",
    "serve": "an OpenAI-compatible HTTP server (/v1/completions with "
             "streaming, /metrics) on 127.0.0.1:8000 (docs/serving.md)",
}
_EXAMPLES = {
    "decode": "specdec_jax decode --gin_file=runs/decode.gin "
              "--gin_file=pairs/default_t5_codegen.gin "
              "--gin_file=methods/token_v3.gin --gin.ALPHA=0.4 "
              "--gin.INPUT_FILE=\"'requests.jsonl'\" "
              "--gin.OUTPUT_DIR=\"'out'\"",
    "eval": "specdec_jax eval --gin_file=runs/eval.gin "
            "--gin_file=pairs/default_t5_codegen.gin "
            "--gin.SWEEP=\"'configs/sweeps.py:smoke'\" --num_examples=8",
    "bench": "specdec_jax bench --gin_file=runs/bench.gin "
             "--gin_file=pairs/default_gemma_completion.gin",
    "plan": "specdec_jax plan",
    "plan-tree": "specdec_jax plan-tree --gin_file=runs/plan_tree.gin "
                 "--gin_file=pairs/default_gemma_completion.gin "
                 "--gin.TEMPERATURE=1.0 --gin.OUTPUT=\"'my_tree.gin'\"",
    "plan-hierarchy": "specdec_jax plan-hierarchy "
                      "--gin_file=runs/plan_hierarchy.gin "
                      "--gin_file=pairs/default_gemma_completion.gin "
                      "--gin.CANDIDATES=\"[%DRAFTER, 'exit:1', 'exit:2']\" "
                      "--gin.OUTPUT=\"'my_hierarchy.gin'\"",
    "main": "specdec_jax main --num_examples=8",
    "serve": "specdec_jax serve --gin.PORT=8000",
}


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


def _gin_listing(width: int = 78) -> list[str]:
  out = []
  for sub in sorted(os.listdir(GIN_DIR)) if os.path.isdir(GIN_DIR) else []:
    names = sorted(os.path.basename(p) for p in glob.glob(
        os.path.join(GIN_DIR, sub, "*.gin")))
    if names:
      label = f"{sub}/".ljust(9) if len(sub) < 9 else f"{sub}/ "
      out += textwrap.wrap(" ".join(names), width,
                           initial_indent=f"  {label}",
                           subsequent_indent=" " * 11)
  return out


def usage(full: bool = False) -> str:
  """The --help text: modes, flags, gin files, one example per mode.

  Args:
    full: also list every flag of every module (--helpfull).
  """
  lines = [
      "specdec_jax: speculative decoding and speculative cascades (T5 v1.1, "
      "Gemma 1/2) in JAX",
      "",
      "Usage: specdec_jax MODE --gin_file=FILE... [--gin.MACRO=VALUE...] "
      "[flags]",
      "       specdec_jax --verify=CHECKPOINT    check a checkpoint's "
      "tensors, then exit",
      "       specdec_jax --help | --helpfull | help",
      "(`python -m specdec_jax.main` is the same command.)",
      "",
      "Modes (positional, or --mode, or run.mode in a gin file):",
  ]
  for m in MODES:
    lines += textwrap.wrap(_MODE_HELP[m], 78, initial_indent=f"  {m:7} ",
                           subsequent_indent=" " * 10)
  lines += ["", f"Gin files: --gin_file is searched in ., then "
            f"--gin_search_paths, then {GIN_DIR}:"]
  lines += _gin_listing()
  lines += textwrap.wrap(
      "Each file starts with a header listing its REQUIRED and commonly "
      "overridden macros. Set a macro with --gin.MACRO=VALUE (strings in "
      "inner quotes: --gin.INPUT_FILE=\"'x.jsonl'\"); a macro that nothing "
      "uses is an error.", 78)
  lines += ["", "Examples (one per mode):"]
  for m in MODES:
    parts = _EXAMPLES[m].split(" --")
    lines.append(f"  {m}:")
    lines.append("    " + " \\\n        --".join(parts))
  module = flags.FLAGS.find_module_defining_flag("gin_file")
  text = flags.FLAGS.module_help(module) if module else ""
  lines += ["", "Flags:"] + [ln for ln in text.splitlines()
                             if ln.strip() and not ln.rstrip().endswith(":")]
  if full:
    lines += ["", "All flags:", flags.FLAGS.get_help()]
  lines += ["", "Errors (bad flags, files, bindings, values, requests) print "
            "one line each and exit with status 2. More: README.md and docs/."]
  return "\n".join(lines)


def help_request(argv: Sequence[str]) -> str | None:
  """'short', 'full' or None: whether ``argv`` asks for the usage.

  The bare command (no arguments), ``help`` as the first argument, and any
  of --help / -h / --helpshort / --helpfull print it.
  """
  args = list(argv[1:])
  if not args:
    return "short"
  if any(a in ("--helpfull", "-helpfull") for a in args):
    return "full"
  if args[0] == "help" or any(a in HELP_ARGS[:5] for a in args):
    return "short"
  return None


# --------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------


def rewrite_gin_args(argv: Sequence[str]) -> list[str]:
  """Turns ``--gin.KEY=VALUE`` into ``--gin_bindings=KEY = VALUE``."""
  out = []
  for arg in argv:
    m = re.fullmatch(r"--gin\.([^=]+)=(.*)", arg, flags=re.S)
    out.append(f"--gin_bindings={m.group(1)} = {m.group(2)}" if m else arg)
  return out


def _maybe_initialize_distributed() -> None:
  import jax  # pylint: disable=g-import-not-at-top
  choice = _DISTRIBUTED.value
  hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
  auto = bool(os.environ.get("JAX_COORDINATOR_ADDRESS")) or (
      "," in hosts)
  if choice == "yes" or (choice == "auto" and auto):
    jax.distributed.initialize()


class _QuietSearch(logging.Filter):
  """Drops gin's 'Path not found' log lines while it searches include paths."""

  def filter(self, record):
    return "Path not found" not in record.getMessage()


def resolve_gin_file(name: str, search_paths: Sequence[str] = ()) -> str:
  """Finds a gin file as given, then under search_paths, then under gin/."""
  for root in ["", *search_paths, GIN_DIR]:
    path = os.path.join(root, name) if root else name
    if os.path.isfile(path):
      return os.path.abspath(path)
  raise FileNotFoundError(
      f"gin file {name!r} not found (searched ., {', '.join(search_paths)}"
      f"{', ' if search_paths else ''}{GIN_DIR})")


def parse_gin(files: Sequence[str], bindings: Sequence[str],
              search_paths: Sequence[str] = ()) -> None:
  """Parses gin files (searched in search_paths and gin/) and bindings.

  Strict (``gin_checks.parse``): an unbalanced bracket names its file and
  line, and a macro that no binding uses (a misspelled ``GAMMA``) is an
  error listing the macros in use.
  """
  paths = [resolve_gin_file(f, search_paths) for f in files]
  for path in list(search_paths) + [GIN_DIR]:
    gin.add_config_file_search_path(path)
  quiet = _QuietSearch()
  logging.getLogger().addFilter(quiet)
  try:
    gin_checks.parse(paths, list(bindings), [GIN_DIR, *search_paths])
  finally:
    logging.getLogger().removeFilter(quiet)


def _flag_bindings() -> list[str]:
  """gin bindings of the convenience flags (--num_examples)."""
  if _NUM_EXAMPLES.value is None:
    return []
  n = int(_NUM_EXAMPLES.value)
  return [f"main_job_spec.num_examples = {n}", f"eval_spec.num_examples = {n}"]


def verify_checkpoints(paths: Sequence[str]) -> int:
  """--verify: prints each checkpoint's report; returns the exit status."""
  from specdec_jax import checkpoints  # pylint: disable=g-import-not-at-top
  status = 0
  for path in paths:
    report = checkpoints.verify(path)
    print(report.table())
    for problem in report.problems:
      print(f"specdec_jax: error: {path}: {problem}", file=sys.stderr)
    for warning in report.warnings:
      print(f"specdec_jax: warning: {path}: {warning}", file=sys.stderr)
    status = status or (0 if report.ok else 2)
  return status


def compilation_cache_dir(flag: str | None) -> str | None:
  """The persistent compilation cache of a CLI run (None: off).

  ``--compilation_cache_dir`` if given ('' turns it off), else
  ``$SPECDEC_JAX_COMPILATION_CACHE`` (same rule), else
  ``$JAX_COMPILATION_CACHE_DIR`` (JAX's own setting), else
  ``<per-user cache>/jax_cache`` (``~/.cache/specdec_jax``, or
  ``$SPECDEC_JAX_CACHE``). Entries are keyed by the program, the JAX version
  and the backend, so a stale cache is harmless; delete the directory to
  reclaim its space.
  """
  from specdec_jax.checkpoints import checksums  # pylint: disable=g-import-not-at-top
  for value in (flag, os.environ.get("SPECDEC_JAX_COMPILATION_CACHE"),
                os.environ.get("JAX_COMPILATION_CACHE_DIR")):
    if value is not None:
      return value or None
  return os.path.join(checksums.cache_root(), "jax_cache")


def enable_compilation_cache(path: str | None) -> None:
  """Turns JAX's persistent compilation cache on at ``path`` (every mode);
  a directory that cannot be created is a warning, never an error."""
  if not path:
    return
  import jax  # pylint: disable=g-import-not-at-top
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:
    print(f"specdec_jax: warning: compilation cache off: cannot create "
          f"{path} ({e.strerror or e}); set --compilation_cache_dir",
          file=sys.stderr)
    return
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def main(argv: Sequence[str]) -> None:
  """Runs the configured mode (flags already parsed).

  The mode comes from a positional argument (``... main plan``), --mode or
  the gin binding ``run.mode``, in that order.
  """
  mode = _MODE.value
  if len(argv) > 1 and argv[1] in MODES:
    mode, argv = argv[1], argv[:1] + argv[2:]
  if len(argv) > 1:
    raise ValueError(f"unexpected arguments: {' '.join(argv[1:])} (usage: "
                     f"specdec_jax [MODE] --gin_file=... --gin.KEY=VALUE; "
                     f"modes: {', '.join(MODES)}; `specdec_jax --help` shows "
                     f"more)")
  _maybe_initialize_distributed()
  cache = compilation_cache_dir(_COMPILATION_CACHE.value)
  enable_compilation_cache(cache)
  parse_gin(_GIN_FILES.value, list(_GIN_BINDINGS.value) + _flag_bindings(),
            _GIN_SEARCH_PATHS.value)
  # Beside the compilation cache: traced programs and shapes, so a warm run
  # neither traces nor lowers (program_cache.py); off again after the run.
  program_cache.enable(cache and os.path.join(cache, "specdec_jax_programs"))
  try:
    run(**({"mode": mode} if mode else {}))
  finally:
    program_cache.enable(None)


def _one_line(e: BaseException) -> str:
  msg = [m.strip() for m in str(e).strip().splitlines()]
  # gin appends "In call to configurable 'run' (<function ...>)": noise here.
  text = " | ".join(m for m in msg if m and not m.startswith(
      "In call to configurable"))
  return f"{type(e).__name__}: {text}" if text else type(e).__name__


def cli(argv: Sequence[str] | None = None) -> None:
  """Console entry point: errors become one line on stderr and exit 2."""
  argv = list(sys.argv if argv is None else argv)
  wanted = help_request(argv)
  if wanted:
    print(usage(full=wanted == "full"))
    sys.exit(0)
  argv = rewrite_gin_args(argv)
  try:
    rest = flags.FLAGS(argv)
  except flags.Error as e:
    print(f"specdec_jax: error: bad flag: {e} (`specdec_jax --help` lists "
          f"the flags)", file=sys.stderr)
    sys.exit(2)
  try:
    if _VERIFY.value:
      sys.exit(verify_checkpoints(_VERIFY.value))
    main(rest)
  except decode_requests.RequestErrors as e:
    for err in e.errors:
      print(f"specdec_jax: error: {err}", file=sys.stderr)
    print(f"specdec_jax: {e.note}", file=sys.stderr)
    sys.exit(2)
  except (ValueError, FileNotFoundError, OSError, TypeError, KeyError,
          SyntaxError, FloatingPointError, ImportError, OverflowError) as e:
    print(f"specdec_jax: error: {_one_line(e)}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
  cli()
