r"""The specdec_jax command line (absl flags + gin), t5x style.

    python -m specdec_jax.main --gin_file=runs/decode.gin \
        --gin_file=pairs/default_t5_codegen.gin \
        --gin_file=methods/token_v3.gin \
        --gin.INPUT_FILE="'prompts.jsonl'" --gin.ALPHA=0.4

Flags: --gin_file (repeatable; resolved against --gin_search_paths and the
shipped gin/ directory), --gin_bindings / --gin.KEY=VALUE (repeatable),
--gin_search_paths (comma separated), --mode (decode | eval | bench | plan |
plan-tree | plan-hierarchy | main | serve | tune; overrides ``run.mode``),
--num_examples,
--verify=CHECKPOINT, --compilation_cache_dir (every mode keeps compiled
programs in a per-user persistent cache, ~/.cache/specdec_jax/jax_cache by
default, so a second run answers without compiling; '' turns it off).
``specdec_jax``, ``specdec_jax help``, ``--help`` and ``--helpfull`` print
the usage (``cli_usage.py``). This module, with ``structure_specs.py``
(tree / hierarchy / strategy) and ``mode_specs.py`` (the other modes),
holds the only gin-configurable wrappers of the code base; the library
stays gin-free.

Errors in files, flags and bindings print one line and exit with status 2;
gin files and bindings are parsed strictly (``gin_checks.py``: unbalanced
brackets name the file and line, a macro nothing uses is a typo). On a TPU
pod slice it calls ``jax.distributed.initialize()`` first and only host 0
writes results.
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

from specdec_jax import decode_requests, decoding, gin_checks
from specdec_jax import mode_specs, program_cache, runs, structure_specs
from specdec_jax.cli_usage import GIN_DIR, MODES, help_request, usage


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
_NO_AUTO = flags.DEFINE_bool(
    "no_auto", False, "mode main: no 'auto' / 'auto (quality budget)' rows "
    "(skips the short tune before each pair's sweep; sets AUTO = False).")
_RETUNE = flags.DEFINE_bool(
    "retune", False, "modes main / tune: tune again instead of reusing a "
    "table of the user cache (or of a resumed main job).")
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
def run(mode: str | None = None, drafter=None, verifier=None, method=None,
        sampling=None, gamma: int = 5, max_new_tokens: int = 64,
        batch_size: int = 8, input_file: str | None = None,
        output_dir: str | None = None, seed: int = 0, tree=None,
        hierarchy=None, strategy=None, tune_file: str | None = None):
  """Runs one mode with the configured models and method.

  ``tree`` (a ``tree_spec()``, gin/trees/*.gin) makes decode verify draft
  trees instead of chains of ``gamma``; ``hierarchy`` (a
  ``hierarchy_spec()``, gin/hierarchies/*.gin) makes it decode with a stack
  of drafters under the verifier (hierarchical speculative decoding).
  ``strategy`` sets the draft structure as one value instead:
  ``@chain()``, ``@tree()`` or ``@stack()``, or ``'auto'``: the row of
  ``tune_file`` (``specdec_jax tune``) for ``batch_size`` -- the largest
  tuned batch size <= it -- sets method and structure (no file: the pair
  is calibrated first).

  Mode 'decode' returns the rows (and raises
  ``decode_requests.RequestErrors`` after writing the good rows when some
  requests were invalid); the other modes return their results.
  """
  if mode not in MODES:
    raise ValueError(f"set --mode or run.mode to one of {', '.join(MODES)} "
                     f"(got {mode!r}); `specdec_jax --help` shows examples")
  if strategy == "auto":
    if mode != "decode":
      raise ValueError(f"run.strategy = 'auto' is read by mode decode (and "
                       f"decoding.decode('auto', ..., tune=) in Python), "
                       f"not by {mode!r}")
    method, gamma, tree = mode_specs.auto_args(tune_file, drafter, verifier,
                                               sampling, batch_size)
    strategy = None
  elif tune_file is not None:
    raise ValueError("run.tune_file is read by run.strategy = 'auto' only")
  gamma, tree, hierarchy = structure_specs.structure_args(
      strategy, gamma, tree, hierarchy)
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
    return mode_specs.plan_spec()
  if mode == "plan-tree":
    return mode_specs.plan_tree_spec()
  if mode == "plan-hierarchy":
    return mode_specs.plan_hierarchy_spec()
  if mode == "main":
    return mode_specs.main_job_spec()
  if mode == "serve":
    return mode_specs.serve_spec()
  if mode == "tune":
    return mode_specs.tune_spec()
  if drafter is None or verifier is None:
    raise ValueError(f"{mode} needs a drafter and a verifier: include a "
                     f"gin/pairs/*.gin file")
  return mode_specs.eval_spec(drafter=drafter, verifier=verifier,
                   max_new_tokens=max_new_tokens, output_dir=output_dir,
                   bench=mode == "bench")


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
  """gin bindings of the convenience flags (--num_examples, --no_auto,
  --retune)."""
  out = ["main_job_spec.auto = False"] if _NO_AUTO.value else []
  if _RETUNE.value:
    out += ["main_job_spec.auto_reuse = False", "tune_spec.reuse = False"]
  if _NUM_EXAMPLES.value is None:
    return out
  n = int(_NUM_EXAMPLES.value)
  return out + [f"main_job_spec.num_examples = {n}",
                f"eval_spec.num_examples = {n}"]


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
