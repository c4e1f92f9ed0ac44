"""Evaluation: the harness, metrics, local datasets, reports and plots.

Import the submodules you need (``from specdec_jax.eval import metrics``);
this package imports nothing heavy on its own and never imports TensorFlow.
The shipped default families are :mod:`specdec_jax.families`; the factory
that trains them is ``tools/default_models/`` (never imported from here).
"""
