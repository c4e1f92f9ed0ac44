"""Shared pytest setup: CPU only, float32 matmuls at full precision."""

import os
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# One persistent compilation cache for the whole run, shared by the xdist
# workers and the subprocesses the tests start (sharding checks, CLIs): a
# program compiled by one module or worker is loaded, not compiled, by the
# next (the module fixture below drops in-memory programs). Keys include the
# JAX version and the program, so an old cache is harmless. Programs that
# compile in under 0.3 s are not kept: keeping every one (min 0) was tried
# in one fresh-clone run (2026-11-28): the suite took 40 min instead of ~30
# (with ~55 more tests) and one worker segfaulted inside JAX's cache write. Set SPECDEC_TEST_XLA_CACHE= (empty) to turn it off.
_CACHE = os.environ.get(
    "SPECDEC_TEST_XLA_CACHE",
    os.path.join(tempfile.gettempdir(), f"specdec_jax_test_xla_cache_{os.getuid()}"))
if _CACHE:
  os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", _CACHE)
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.3")

# specdec_jax's per-user cache (checksum sidecars of foreign checkpoints, the
# CLI's compilation cache) goes to a fresh directory per run: test
# checkpoints reuse temporary paths across runs.
os.environ.setdefault("SPECDEC_JAX_CACHE",
                      tempfile.mkdtemp(prefix="specdec_jax_cache_"))

import jax  # noqa: E402  pylint: disable=g-import-not-at-top

jax.config.update("jax_default_matmul_precision", "highest")


import pytest  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position


@pytest.fixture(autouse=True, scope="module")
def _drop_compiled_programs_after_each_module():
  """A test worker lives for the whole suite and compiles thousands of
  programs; each keeps its machine code mapped, and past the kernel's
  memory-map limit LLVM aborts the worker ("Cannot allocate memory"; CI lost
  two workers that way). Free them between modules (decoding.clear_compiled
  also clears JAX's own caches)."""
  yield
  from specdec_jax.decoding.loops import program  # pylint: disable=g-import-not-at-top
  program.clear_compiled()
