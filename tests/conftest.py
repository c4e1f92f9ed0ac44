"""Shared pytest setup: CPU only, float32 matmuls at full precision."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import jax  # noqa: E402  pylint: disable=g-import-not-at-top

jax.config.update("jax_default_matmul_precision", "highest")
