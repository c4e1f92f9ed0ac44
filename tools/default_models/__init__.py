"""The default-model factory: builds ``specdec_jax/assets/default_models``.

Corpus selection (:mod:`pretraining`), the training loop (:mod:`train`),
distillation (:mod:`distill`), the families' evaluation (:mod:`family_eval`)
and the build pipeline (:mod:`build`, with :mod:`plan`, :mod:`bundle`,
:mod:`snapshot`, :mod:`stage_lock`) plus two analyses (:mod:`significance`,
:mod:`input_dependence`). Run from the repository root, e.g.
``python -m tools.default_models.build --smoke --out /tmp/dm --workdir
/tmp/dm_work``; see README.md here. The engine (``specdec_jax/``) never
imports this package (tests/test_layout.py).
"""
