"""Moved to :mod:`specdec_jax.families` (this name stays importable).

``from specdec_jax.eval import default_models`` is the same module object as
:mod:`specdec_jax.families.loader`, so reading or patching its attributes
(``ASSETS``, ``load``, ...) acts on the loader itself.
"""

import sys

from specdec_jax.families import loader as _loader

sys.modules[__name__] = _loader
