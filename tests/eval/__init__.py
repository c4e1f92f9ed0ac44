"""Tests of specdec_jax.eval (evaluation: harness, metrics, reports)."""
