"""Tests of specdec_jax.eval and of the default-model scripts."""

from tests import load_script

__all__ = ["load_script"]  # shared by this package's tests
