"""Evaluation: metrics, local datasets, sweeps and benchmarks.

Import the submodules you need (``from specdec_jax.eval import metrics``);
this package imports nothing heavy on its own and never imports TensorFlow.
"""
