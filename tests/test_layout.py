"""The engine never imports the default-model factory (tools/).

``tools/default_models`` (corpus selection, pretraining, distillation, the
build pipeline) is a developer tool outside the installed package; the
engine under ``specdec_jax/`` must work without it.
"""

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "specdec_jax")


def imported_modules(source: str) -> set[str]:
  """Top-level and dotted names every import statement of ``source`` names."""
  names = set()
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      names.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      names.add(node.module)
  return names


def engine_imports_of_tools() -> list[str]:
  """'path: module' for every import of ``tools`` under specdec_jax/."""
  found = []
  for dirpath, _, files in os.walk(PACKAGE):
    for name in sorted(files):
      if not name.endswith(".py"):
        continue
      path = os.path.join(dirpath, name)
      with open(path, encoding="utf-8") as f:
        mods = imported_modules(f.read())
      found += [f"{os.path.relpath(path, ROOT)}: {m}" for m in sorted(mods)
                if m == "tools" or m.startswith("tools.")]
  return found


def test_the_engine_never_imports_tools():
  assert not engine_imports_of_tools(), (
      "specdec_jax/ imports the default-model factory; move what the engine "
      "needs at run time into specdec_jax/ (e.g. specdec_jax/families)")


def test_the_scan_sees_every_import_form():
  src = ("import tools.default_models.train\nfrom tools import x\n"
         "from tools.default_models import build as b\nfrom . import tools\n"
         "import toolset\n")
  mods = imported_modules(src)
  assert {"tools.default_models.train", "tools",
          "tools.default_models"} <= mods
  assert "toolset" in mods and None not in mods


def test_the_factory_is_not_installed():
  with open(os.path.join(ROOT, "setup.py"), encoding="utf-8") as f:
    setup = f.read()
  if 'include=["specdec_jax", "specdec_jax.*"]' not in setup:
    pytest.fail("setup.py must package specdec_jax only (not tools/)")
