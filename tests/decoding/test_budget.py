"""One memory budget: sizes are refused before anything allocates."""

import os
import subprocess
import sys
import textwrap

from specdec_jax.decoding import budget

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def test_capacity_is_prompt_new_tokens_block_and_slack():
  assert budget.capacity(16, 64, 5) == 16 + 64 + 5 + 2
  assert budget.capacity(16, 64, 6, chunk=1) == 16 + 64 + 6 + 2 + 1


def test_check_names_the_knob():
  budget.check(10, "x", "y", "z", have=(10, "host memory"))
  try:
    budget.check(3 * budget.GIB, "max_new_tokens=9 with batch 1",
                 "its KV caches", "lower max_new_tokens",
                 have=(budget.GIB, "host memory"))
  except ValueError as e:
    assert str(e) == ("max_new_tokens=9 with batch 1 needs 3.0 GiB for its "
                      "KV caches but the host memory is 1.0 GiB; lower "
                      "max_new_tokens")
  else:
    raise AssertionError("no error")


# Runs under an address-space limit 3 GiB above what the process maps after
# its imports: an allocation of the 2e7-token decode (~40 GiB at XLA's peak)
# would fail, so passing means the refusal came first.
_LIMITED = textwrap.dedent("""
    import re, resource, sys
    from specdec_jax import decoding
    from specdec_jax.decoding import api, budget
    from tests.decoding.pairs import tiny_pair
    d, v, qp, pp = tiny_pair("gemma")
    spec = decoding.make_method("spec_decode")
    resource.setrlimit(resource.RLIMIT_AS,
                       (budget._vm_size() + 3 * 2**30, resource.RLIM_INFINITY))
    try:
      decoding.generate(spec, d, v, qp, pp, [[2, 5]],
                        max_new_tokens=20_000_000)
    except ValueError as e:
      message = str(e)
      print("REFUSED", message)
    else:
      print("NOT REFUSED")
      sys.exit(1)
    fit = int(re.search(r"lower max_new_tokens to (\\d+) or fewer",
                        message).group(1))
    class Reached(Exception):
      pass
    def stop(*args, **kwargs):
      raise Reached
    api.run_program = stop
    try:
      decoding.generate(spec, d, v, qp, pp, [[2, 5]], max_new_tokens=fit)
    except Reached:
      print("FITS", fit)
""")


def test_2e7_new_tokens_are_refused_before_allocation_under_ulimit():
  proc = subprocess.run(
      [sys.executable, "-c", _LIMITED], cwd=ROOT, capture_output=True,
      text=True, timeout=300,
      env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT))
  out = proc.stdout
  assert proc.returncode == 0, (out + proc.stderr)[-3000:]
  assert ("REFUSED max_new_tokens=20000000 with batch 1 (prompt width 16) "
          "needs ") in out
  assert ("GiB for its KV caches, token buffers and XLA's working copies "
          "(4 x the ") in out
  assert "but the host memory is " in out
  assert "FITS " in out  # the suggested size passes the check
