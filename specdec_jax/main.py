r"""The specdec_jax command line (absl flags + gin), t5x style.

    python -m specdec_jax.main --gin_file=pairs/default_t5_docstring.gin \
        --gin_file=methods/token_v3.gin --gin_file=runs/decode.gin \
        --gin.INPUT_FILE="'prompts.jsonl'" --gin.ALPHA=0.4

Flags: --gin_file (repeatable; resolved against --gin_search_paths and the
shipped gin/ directory), --gin_bindings / --gin.KEY=VALUE (repeatable),
--gin_search_paths (comma separated), --mode (decode | eval | bench | plan |
main; overrides ``run.mode``). This module holds the only gin-configurable
wrappers of the code base; the library stays gin-free.

Errors in files, flags and bindings print one line and exit with status 2.
On a TPU pod slice it calls ``jax.distributed.initialize()`` first and only
host 0 writes results.
"""

from __future__ import annotations

import inspect
import logging
import os
import re
import sys
from typing import Sequence

from absl import flags
import gin

from specdec_jax import decoding, runs

GIN_DIR = os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "gin")
MODES = ("decode", "eval", "bench", "plan", "main")

_GIN_FILES = flags.DEFINE_multi_string(
    "gin_file", [], "gin files, in order (later ones override earlier).")
_GIN_BINDINGS = flags.DEFINE_multi_string(
    "gin_bindings", [], "gin bindings, e.g. \"ALPHA = 0.3\".")
_GIN_SEARCH_PATHS = flags.DEFINE_list(
    "gin_search_paths", [], "directories searched for gin files and includes.")
_MODE = flags.DEFINE_enum("mode", None, list(MODES),
                          "what to run (overrides run.mode).")
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
def run(mode: str | None = None, drafter=None, verifier=None, method=None,
        sampling=None, gamma: int = 5, max_new_tokens: int = 64,
        batch_size: int = 8, input_file: str | None = None,
        output_dir: str | None = None, seed: int = 0):
  """Runs one mode with the configured models and method."""
  if mode not in MODES:
    raise ValueError(f"set --mode or run.mode to one of {', '.join(MODES)} "
                     f"(got {mode!r})")
  if mode == "decode":
    if verifier is None:
      raise ValueError("decode needs a verifier: bind run.verifier (e.g. "
                       "include a gin/pairs/*.gin file)")
    method = method or decoding.make_method("spec_decode")
    out = os.path.join(output_dir, "decodes.jsonl") if output_dir else None
    rows = runs.run_decode(drafter, verifier, method, sampling, gamma,
                           max_new_tokens, batch_size, input_file, out, seed)
    summary = runs.summarize(rows)
    print(runs.format_table(list(summary), [list(summary.values())]),
          file=sys.stderr)
    return rows
  if mode == "plan":
    return plan_spec()
  if mode == "main":
    return main_job_spec()
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
  every call 3 times and keeps the fastest.
  """
  cfg = _load_sweep(sweep)
  if sweep_overrides:
    cfg.update(dict(sweep_overrides))
  if max_new_tokens and "max_new_tokens" not in (sweep_overrides or {}):
    cfg.max_new_tokens = max_new_tokens
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
  """Parses gin files (searched in search_paths and gin/) and bindings."""
  paths = [resolve_gin_file(f, search_paths) for f in files]
  for path in list(search_paths) + [GIN_DIR]:
    gin.add_config_file_search_path(path)
  quiet = _QuietSearch()
  logging.getLogger().addFilter(quiet)
  try:
    gin.parse_config_files_and_bindings(paths, list(bindings),
                                        finalize_config=True)
  finally:
    logging.getLogger().removeFilter(quiet)


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
                     f"modes: {', '.join(MODES)})")
  _maybe_initialize_distributed()
  parse_gin(_GIN_FILES.value, _GIN_BINDINGS.value, _GIN_SEARCH_PATHS.value)
  run(**({"mode": mode} if mode else {}))


def _one_line(e: BaseException) -> str:
  msg = str(e).strip().splitlines()
  text = " | ".join(m.strip() for m in msg if m.strip())
  return f"{type(e).__name__}: {text}" if text else type(e).__name__


def cli(argv: Sequence[str] | None = None) -> None:
  """Console entry point: errors become one line on stderr and exit 2."""
  argv = rewrite_gin_args(sys.argv if argv is None else argv)
  try:
    rest = flags.FLAGS(argv)
  except flags.Error as e:
    print(f"specdec_jax: error: bad flag: {e}", file=sys.stderr)
    sys.exit(2)
  try:
    main(rest)
  except (ValueError, FileNotFoundError, OSError, TypeError, KeyError,
          SyntaxError, FloatingPointError, ImportError) as e:
    print(f"specdec_jax: error: {_one_line(e)}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
  cli()
