"""Tests of specdec_jax.families (the shipped default families)."""
