"""specdec_jax's tests."""

import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "scripts")


def load_script(name: str, module_name: str | None = None):
  """Imports ``scripts/<name>.py`` (scripts/ is no package).

  The module is registered in ``sys.modules`` under ``module_name`` (default
  ``name``), where its dataclasses look their module up, and ``scripts/`` is
  on ``sys.path`` while it runs, for the sibling modules it imports.
  """
  module_name = module_name or name
  spec = importlib.util.spec_from_file_location(
      module_name, os.path.join(SCRIPTS, f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  sys.modules[module_name] = module
  sys.path.insert(0, SCRIPTS)
  try:
    spec.loader.exec_module(module)
  finally:
    sys.path.remove(SCRIPTS)
  return module
