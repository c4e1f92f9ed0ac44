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


# ----------------------------------------------------------------------------
# Sizes: small files, short functions (issue 38)
# ----------------------------------------------------------------------------

MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 80
SIZED_FOLDERS = ("decoding", "models", "checkpoints")
# Files and functions over the limits that other work still splits; each
# entry names what it waits for. Do not add to it: split the code instead.
KNOWN_LARGE = {}


def python_files(*folders: str) -> list[str]:
  """Paths (relative to the repo) of the .py files under specdec_jax/
  ``folders`` (recursively) and, with ``''`` among them, specdec_jax/*.py."""
  out = []
  for folder in folders:
    if not folder:
      out += [os.path.join("specdec_jax", n) for n in sorted(os.listdir(
          PACKAGE)) if n.endswith(".py")]
      continue
    for dirpath, _, files in os.walk(os.path.join(PACKAGE, folder)):
      out += [os.path.relpath(os.path.join(dirpath, n), ROOT)
              for n in sorted(files) if n.endswith(".py")]
  return out


def oversized(paths, max_file: int = MAX_FILE_LINES,
              max_function: int = MAX_FUNCTION_LINES) -> list[str]:
  """'path: N lines' and 'path:function: N lines' over the limits."""
  found = []
  for rel in paths:
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
      source = f.read()
    lines = len(source.splitlines())
    if lines > max_file:
      found.append(f"{rel}: {lines} lines")
    for node in ast.walk(ast.parse(source)):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        n = node.end_lineno - node.lineno + 1
        if n > max_function:
          found.append(f"{rel}:{node.name}: {n} lines")
  return found


def test_no_large_file_or_function():
  """decoding/, models/, checkpoints/ and the CLI modules (specdec_jax/*.py)
  keep files <= 400 lines and functions <= 80 lines (docstring included)."""
  found = oversized(python_files(*SIZED_FOLDERS, ""))
  new = [f for f in found if f.split(": ")[0] not in KNOWN_LARGE]
  assert not new, ("split these (move code into a new module or helper "
                   "function; STYLE.md: files < ~400 lines):\n" +
                   "\n".join(new))


def test_the_size_check_sees_files_and_functions(tmp_path):
  body = "\n".join(f"  x{i} = {i}" for i in range(90))
  src = f"def long():\n{body}\n\n\ndef short():\n  return 1\n"
  path = tmp_path / "m.py"
  path.write_text(src)
  global ROOT  # pylint: disable=global-statement
  root, ROOT = ROOT, str(tmp_path)
  try:
    assert oversized(["m.py"], max_file=50) == ["m.py: 95 lines",
                                                "m.py:long: 91 lines"]
  finally:
    ROOT = root


# ----------------------------------------------------------------------------
# Imports: one way, no circles, no private names (issue 38)
# ----------------------------------------------------------------------------

# Each area of the package and its layer: an area imports its own layer and
# lower ones, never a higher one. The CLI modules (specdec_jax/*.py entry
# points) are the top; library modules at the top level have their own row.
LAYERS = (
    ("program_cache",),  # the compiled-program store: imports no module here
    ("models",),
    ("sharding",),
    ("checkpoints",),
    ("tokenizer",),
    ("decoding", "timing"),
    ("families",),
    ("eval", "serving", "t5x", "seqio"),
    ("cli",),
)
_RANK = {area: n for n, areas in enumerate(LAYERS) for area in areas}


def modules() -> dict[str, str]:
  """Dotted module name -> path of every module of the package."""
  out = {}
  for rel in python_files("decoding", "models", "checkpoints", "eval",
                          "families", "serving", "t5x", "seqio", ""):
    name = rel[:-3].replace(os.sep, ".")
    out[name[:-len(".__init__")] if name.endswith(".__init__") else name] = (
        os.path.join(ROOT, rel))
  out["specdec_jax"] = os.path.join(PACKAGE, "__init__.py")
  return out


def area(module: str) -> str:
  """The layer area of a module: its subpackage, or 'cli' for a top-level
  module that is not a library row of :data:`LAYERS`."""
  parts = module.split(".")
  if len(parts) < 2:
    return "cli"
  if parts[1] in _RANK:
    return parts[1]
  return "cli"


def import_graph(mods: dict[str, str]) -> dict[str, set[str]]:
  """module -> the package modules it imports (anywhere in the file, so an
  import inside a function counts: it hides a circle, it does not break it).
  ``from pkg import name`` is an edge to ``pkg.name`` when that is a module,
  else to ``pkg``."""
  def resolve(name):
    while name and name not in mods:
      name = name.rpartition(".")[0]
    return name
  graph = {}
  for mod, path in mods.items():
    with open(path, encoding="utf-8") as f:
      tree = ast.parse(f.read())
    package = mod if path.endswith("__init__.py") else mod.rpartition(".")[0]
    edges = set()
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
          up = package.split(".")[:len(package.split(".")) - node.level + 1]
          base = ".".join(up + ([base] if base else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                 for a in node.names]
      else:
        continue
      edges |= {resolve(n) for n in names if n.startswith("specdec_jax")}
    graph[mod] = edges - {mod, ""}
  return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components of more than one module."""
  index, low, stack, on, out = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on.add(v)
    for w in sorted(graph.get(v, ())):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while True:
        w = stack.pop()
        on.discard(w)
        comp.append(w)
        if w == v:
          break
      if len(comp) > 1:
        out.append(sorted(comp))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return out


def test_no_import_circle():
  found = circles(import_graph(modules()))
  assert not found, ("these modules import each other (directly or through "
                     "others); move the shared part down a layer:\n" +
                     "\n".join(" <-> ".join(c) for c in found))


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
  """'a -> b' for every import from a lower layer into a higher one."""
  return [f"{a} -> {b}" for a in sorted(graph) for b in sorted(graph[a])
          if _RANK[area(b)] > _RANK[area(a)]]


def test_no_import_from_a_lower_layer_to_a_higher_one():
  found = upward_imports(import_graph(modules()))
  assert not found, ("a lower layer imports a higher one (tests/test_layout.py"
                     " LAYERS); move the code it needs down:\n" +
                     "\n".join(found))


# Private names imported from another module that other work still renames
# (the importer is outside this files); do not add to it.
KNOWN_PRIVATE = set()


def private_imports(mods: dict[str, str]) -> list[tuple[str, str]]:
  """(path, 'module._name') for every ``from m import _name`` and every
  ``m._name`` read through an imported package module."""
  found = []
  for path in mods.values():
    rel = os.path.relpath(path, ROOT)
    with open(path, encoding="utf-8") as f:
      tree = ast.parse(f.read())
    imported = {}
    for node in ast.walk(tree):
      if isinstance(node, ast.ImportFrom) and (
          node.module or "").startswith("specdec_jax"):
        for a in node.names:
          full = f"{node.module}.{a.name}"
          if a.name.startswith("_") and not a.name.startswith("__"):
            found.append((rel, full))
          if full in mods:
            imported[a.asname or a.name] = full
      elif isinstance(node, ast.Import):
        for a in node.names:
          if a.name.startswith("specdec_jax") and a.asname:
            imported[a.asname] = a.name
    for node in ast.walk(tree):
      if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
          and not node.attr.startswith("__")
          and isinstance(node.value, ast.Name)
          and node.value.id in imported):
        found.append((rel, f"{imported[node.value.id]}.{node.attr}"))
  return sorted(set(found))


def test_no_private_cross_module_import():
  found = [f for f in private_imports(modules()) if f not in KNOWN_PRIVATE]
  assert not found, ("these read another module's private name; make it "
                     "public (no leading underscore) where it is defined:\n" +
                     "\n".join(f"{p}: {n}" for p, n in found))


def test_the_import_scan_sees_circles_layers_and_private_names(tmp_path):
  pkg = tmp_path / "specdec_jax"
  (pkg / "models").mkdir(parents=True)
  (pkg / "__init__.py").write_text("")
  (pkg / "models" / "__init__.py").write_text("")
  (pkg / "models" / "a.py").write_text(
      "def f():\n  from specdec_jax.models import b\n")
  (pkg / "models" / "b.py").write_text(
      "from specdec_jax.models.a import _hidden\nfrom specdec_jax import main\n")
  (pkg / "main.py").write_text(
      "from specdec_jax.models import a\nx = a._private\n")
  mods = {"specdec_jax": str(pkg / "__init__.py"),
          "specdec_jax.models": str(pkg / "models" / "__init__.py"),
          "specdec_jax.models.a": str(pkg / "models" / "a.py"),
          "specdec_jax.models.b": str(pkg / "models" / "b.py"),
          "specdec_jax.main": str(pkg / "main.py")}
  graph = import_graph(mods)
  assert graph["specdec_jax.models.a"] == {"specdec_jax.models.b"}
  assert circles(graph) == [["specdec_jax.main", "specdec_jax.models.a",
                             "specdec_jax.models.b"]]
  assert upward_imports(graph) == ["specdec_jax.models.b -> specdec_jax.main"]
  global ROOT  # pylint: disable=global-statement
  root, ROOT = ROOT, str(tmp_path)
  try:
    assert private_imports(mods) == [
        ("specdec_jax/main.py", "specdec_jax.models.a._private"),
        ("specdec_jax/models/b.py", "specdec_jax.models.a._hidden")]
  finally:
    ROOT = root
