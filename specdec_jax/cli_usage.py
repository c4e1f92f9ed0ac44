"""The command line's usage text (``specdec_jax --help``) and its modes.

Split from ``main.py`` (the entry point, which imports it): the modes, the
help flags, the shipped gin directory, one line and one example per mode.
"""

from __future__ import annotations

import glob
import os
import textwrap
from typing import Sequence

from absl import flags

GIN_DIR = os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "gin")
MODES = ("decode", "eval", "bench", "plan", "plan-tree", "plan-hierarchy",
         "main", "serve", "tune")
HELP_ARGS = ("--help", "-h", "-help", "--helpshort", "-?", "--helpfull",
             "-helpfull", "help")

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
    "tune": "time target-only, chains and trees per batch size; choose the "
            "fastest lossless (or best-within-budget) strategy and write "
            "the auto strategy file (run.strategy = 'auto')",
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
    "tune": "specdec_jax tune --gin_file=runs/tune.gin "
            "--gin_file=pairs/default_t5_codegen.gin "
            "--gin.OUTPUT=\"'auto.gin'\"",
}



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
                             if ln.strip() and (ln.lstrip().startswith("--")
                                                or not ln.rstrip().endswith(
                                                    ":"))]
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
