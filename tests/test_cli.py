"""The command line: one clear line and exit status 2 on bad input."""

import subprocess
import sys

import pytest

from specdec_jax import main

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


def test_gin_dot_flags_are_rewritten():
  assert main.rewrite_gin_args(["x", "--gin.ALPHA=0.3", "--mode=decode"]) == [
      "x", "--gin_bindings=ALPHA = 0.3", "--mode=decode"]
