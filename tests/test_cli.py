"""The command line: usage on --help, one clear line and exit status 2 on
bad input (strict gin), --verify and --num_examples."""

import os
import subprocess
import sys

from absl import flags
import gin
import pytest

from specdec_jax import checkpoints, main, runs
from tests.checkpoints.helpers import tiny

BASE = ["--gin_file=runs/decode.gin", "--gin_file=pairs/tiny_random.gin"]


def _cli(*args, stdin=None):
  proc = subprocess.run([sys.executable, "-m", "specdec_jax.main", *args],
                        capture_output=True, text=True, input=stdin,
                        timeout=300)
  return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.parametrize("args,message", [
    (["--gin_file=pairs/missing.gin"], "gin file 'pairs/missing.gin' not "
     "found"),
    (["--no_such_flag=1"], "bad flag: Unknown command line flag "
     "'no_such_flag'"),
    ([*BASE, "--gin.method_spec.name='fast'", "--gin.INPUT_FILE='x.jsonl'"],
     "unknown method 'fast'; choose one of"),
    ([*BASE, "--gin.INPUT_FILE='/nonexistent/requests.jsonl'"],
     "input file not found: /nonexistent/requests.jsonl"),
    (["--gin_file=runs/decode.gin", "--mode=decode"],
     "DRAFTER/macro.value set to `%gin.REQUIRED`"),
])
def test_errors_are_one_line(args, message):
  code, _, err = _cli(*args)
  assert code == 2
  lines = [ln for ln in err.splitlines() if ln.startswith("specdec_jax:")]
  assert len(lines) == 1 and message in lines[0], err
  assert "Traceback" not in err


def test_decode_from_stdin_prints_jsonl():
  code, out, err = _cli(*BASE, "--gin.MAX_NEW_TOKENS=3",
                        stdin='{"tokens": [2, 4, 6]}\n')
  assert code == 0, err
  assert '"num_tokens": 3' in out
  assert "tokens_per_s" in err  # the summary table
  assert "compile_s" in err and "decode_s" in err  # issue 43: split


def test_gin_dot_flags_are_rewritten():
  assert main.rewrite_gin_args(["x", "--gin.ALPHA=0.3", "--mode=decode"]) == [
      "x", "--gin_bindings=ALPHA = 0.3", "--mode=decode"]


def _cli_here(capsys, *args):
  """``specdec_jax *args`` in this process: (exit status, stdout, stderr)."""
  flags.FLAGS.unparse_flags()
  gin.clear_config()
  code = 0
  try:
    main.cli(["specdec_jax", *args])
  except SystemExit as e:
    code = e.code or 0
  finally:
    gin.clear_config()
  out = capsys.readouterr()
  return code, out.out, out.err


@pytest.mark.parametrize("args", [[], ["--help"], ["-h"], ["help"],
                                  ["decode", "--help"], ["--helpfull"]])
def test_help_prints_modes_flags_gin_files_and_examples(capsys, args):
  code, out, err = _cli_here(capsys, *args)
  assert code == 0 and not err
  assert out.startswith("specdec_jax: speculative decoding")
  for mode in main.MODES:
    assert f"\n  {mode:7} " in out  # the mode's line
    assert f"\n  {mode}:\n    specdec_jax {mode}" in out  # its example
  assert f"then {main.GIN_DIR}:" in out
  assert "\n  runs/    bench.gin decode.gin eval.gin main_job.gin plan.gin" in out
  for flag in ("--gin_file", "--gin_bindings", "--gin_search_paths", "--mode",
               "--num_examples", "--verify"):
    assert f"  {flag}:" in out
  assert ("All flags:" in out) == (args == ["--helpfull"])


def test_console_script_help(tmp_path):
  exe = os.path.join(os.path.dirname(sys.executable), "specdec_jax")
  if not os.path.exists(exe):
    pytest.skip("the specdec_jax console script is not installed")
  proc = subprocess.run([exe, "--help"], capture_output=True, text=True,
                        timeout=300, cwd=tmp_path)
  assert proc.returncode == 0 and "Examples (one per mode):" in proc.stdout


@pytest.mark.parametrize("args,message", [
    (["--gin.GAMA=1"], "ValueError: unknown gin macro GAMA (set in binding "
     "'GAMA = 1'): no binding uses it, so it would be ignored; did you mean "
     "GAMMA?. Known macros: BATCH_SIZE, DRAFTER, GAMMA, INPUT_FILE, "
     "MAX_NEW_TOKENS, METHOD, OUTPUT_DIR, SEED, TEMPERATURE, TOP_P, VERIFIER"),
    (["--gin.GAMMA=(3"], "ValueError: binding 'GAMMA = (3': '(' at column 9 "
     "is never closed"),
    (["--gin.GAMMA=3)"], "ValueError: binding 'GAMMA = 3)': unmatched ')' at "
     "column 10"),
])
def test_gin_typos_and_brackets_are_one_line_errors(capsys, args, message):
  code, _, err = _cli_here(capsys, *BASE, *args)
  assert code == 2
  assert err.splitlines() == [f"specdec_jax: error: {message}"]


def test_gin_file_typos_and_brackets_name_file_and_line(tmp_path, capsys):
  typo = tmp_path / "typo.gin"
  typo.write_text("GAMMA = 3\nGAMMMA = 1\n")
  code, _, err = _cli_here(capsys, *BASE, f"--gin_file={typo}")
  assert code == 2 and err.startswith(
      f"specdec_jax: error: ValueError: unknown gin macro GAMMMA (set in "
      f"{typo}:2): no binding uses it, so it would be ignored; did you mean "
      f"GAMMA?. Known macros: BATCH_SIZE, ")
  bad = tmp_path / "bad.gin"
  bad.write_text("GAMMA = 3\nMETHOD_KNOBS = {'alpha': [0.1, 0.2}\n")
  code, _, err = _cli_here(capsys, *BASE, f"--gin_file={bad}")
  assert code == 2 and err.splitlines() == [
      f"specdec_jax: error: ValueError: {bad}:2: unmatched '}}' at column 35"]
  bad.write_text("GAMMA = (3\nMAX_NEW_TOKENS = 4\n")
  code, _, err = _cli_here(capsys, *BASE, f"--gin_file={bad}")
  assert code == 2 and err.splitlines() == [
      f"specdec_jax: error: ValueError: {bad}:1: '(' at column 9 is never "
      f"closed"]
  bad.write_bytes(b"GAMMA = 3\n# caf\xe9\n")
  code, _, err = _cli_here(capsys, *BASE, f"--gin_file={bad}")
  assert code == 2 and err.splitlines() == [
      f"specdec_jax: error: ValueError: {bad}:2: not valid UTF-8 (byte 0xe9); "
      f"save the gin file as UTF-8"]


def test_macros_of_other_shipped_run_files_are_known(monkeypatch):
  # The default pairs set EVAL_TASK / EVAL_METRICS for runs/eval.gin; with
  # runs/decode.gin nothing reads them, and that is not a typo.
  gin.clear_config()
  try:
    main.parse_gin(["runs/decode.gin", "pairs/default_t5_codegen.gin"],
                   ["EVAL_TASK = 'x.jsonl'"])
  finally:
    gin.clear_config()


def test_retune_flag_reaches_main_job_and_tune(capsys, monkeypatch):
  from specdec_jax.eval import main_job  # pylint: disable=g-import-not-at-top
  seen = []
  monkeypatch.setattr(main_job, "run_main_job", lambda out, pairs=None, **kw:
                      seen.append(kw["auto_settings"].reuse))
  for args in ((), ("--retune",)):
    code, _, err = _cli_here(capsys, "main", *args)
    assert code == 0, err
  from specdec_jax import tune_run  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(tune_run, "run_tune", lambda *a, **kw:
                      seen.append(kw["reuse"]))
  for args in ((), ("--retune",)):
    code, _, err = _cli_here(capsys, "tune", "--gin_file=runs/tune.gin",
                             "--gin_file=pairs/tiny_random.gin", *args)
    assert code == 0, err
  assert seen == [True, False, True, False]


def test_num_examples_flag_reaches_main_job_and_eval(capsys, monkeypatch):
  from specdec_jax.eval import main_job  # pylint: disable=g-import-not-at-top
  seen = {}
  monkeypatch.setattr(main_job, "run_main_job", lambda out, pairs=None, **kw:
                      seen.update(main=kw.get("num_examples")))
  code, _, err = _cli_here(capsys, "main", "--num_examples=3")
  assert code == 0 and seen == {"main": 3}, err
  monkeypatch.setattr(main_job, "run_main_job", lambda out, pairs=None, **kw:
                      seen.update(auto=kw["auto"]))
  code, _, err = _cli_here(capsys, "main", "--no_auto")
  assert code == 0 and seen["auto"] is False, err
  code, _, err = _cli_here(capsys, "main")
  assert code == 0 and seen["auto"] is True, err
  monkeypatch.setattr(runs, "load_pair", lambda *a: type(
      "P", (), {"verifier": tiny("gemma_tiny")[0]})())
  monkeypatch.setattr(runs, "load_examples", lambda *a, **k: seen.update(
      eval=a[2]) or [])
  monkeypatch.setattr(runs, "run_eval", lambda *a, **k: None)
  code, _, err = _cli_here(capsys, "eval", "--gin_file=runs/eval.gin",
                           "--gin_file=pairs/tiny_random.gin",
                           "--gin.EVAL_TASK='x.jsonl'",
                           "--gin.EVAL_METRICS=['bleu']", "--num_examples=5")
  assert code == 0 and seen["eval"] == 5, err
  code, _, err = _cli_here(capsys, "main", "--num_examples=0")
  assert code == 2 and "bad flag" in err and "num_examples" in err


def test_verify_flag_checks_checkpoints(tmp_path, capsys):
  model, params = tiny("gemma_tiny")
  good = tmp_path / "good"
  checkpoints.save(str(good), model, params)
  code, out, err = _cli_here(capsys, f"--verify={good}")
  assert code == 0, err
  assert out.splitlines()[-1] == (
      f"OK: {good} (native), 16 tensors; checksums: 16 of 16 match; 0 "
      f"warning(s)")
  assert "\nembedder/input_embedding " in out
  data = bytearray((good / "params.safetensors").read_bytes())
  data[-3] ^= 0x40  # inside the last tensor's bytes
  (good / "params.safetensors").write_bytes(bytes(data))
  code, out, err = _cli_here(capsys, f"--verify={good}")
  assert code == 2
  (line,) = [ln for ln in err.splitlines() if "error" in ln]
  assert line.startswith(f"specdec_jax: error: {good}: tensor '")
  assert "fails its checksum" in line


def test_compilation_cache_dir_flag_env_and_default(monkeypatch):
  for var in ("SPECDEC_JAX_COMPILATION_CACHE", "JAX_COMPILATION_CACHE_DIR"):
    monkeypatch.delenv(var, raising=False)
  monkeypatch.setenv("SPECDEC_JAX_CACHE", "/c")
  assert main.compilation_cache_dir(None) == "/c/jax_cache"
  assert main.compilation_cache_dir("/x") == "/x"
  assert main.compilation_cache_dir("") is None  # '' turns it off
  monkeypatch.setenv("SPECDEC_JAX_COMPILATION_CACHE", "")
  assert main.compilation_cache_dir(None) is None
  assert main.compilation_cache_dir("/x") == "/x"


def test_compile_clock_counts_tracing_and_compiling_once():
  import jax  # pylint: disable=g-import-not-at-top
  from specdec_jax import decode_run  # pylint: disable=g-import-not-at-top
  f = jax.jit(lambda x: jax.numpy.sin(x) * 3 + 1)
  with decode_run.CompileClock() as first:
    f(jax.numpy.ones(7)).block_until_ready()
  with decode_run.CompileClock() as again:
    f(jax.numpy.ones(7)).block_until_ready()
  assert first.seconds > 0 and again.seconds == 0
  clock = decode_run.CompileClock()
  clock.spans = [(0.0, 2.0), (1.0, 3.0), (5.0, 6.0)]  # nested spans once
  assert clock.seconds == 4.0
