"""Tests of specdec_jax.eval and of the default-model scripts."""

import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))


def load_script(name: str):
  """Imports ``scripts/<name>.py`` as module ``name`` (scripts/ is no
  package)."""
  spec = importlib.util.spec_from_file_location(
      name, os.path.join(ROOT, "scripts", f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module
  spec.loader.exec_module(module)
  return module
