"""Strict gin parsing for the command line (``specdec_jax.main``).

gin is lenient in two ways that change results silently or fail without a
location, and this module closes both:

* brackets: an unbalanced ``(``, ``[`` or ``{`` in a file or a binding makes
  gin's tokenizer raise ``tokenize.TokenError`` with no file name.
  :func:`check_brackets` scans every file and binding first and names the
  file, line and column of the bracket that is never closed (or the closer
  that has no opener).
* macros: ``GAMA = 1`` (a typo of ``GAMMA``) defines a new macro that nothing
  reads, so the default is used. :func:`check_macros` rejects a macro that no
  parsed binding refers to (``%GAMA``) and no shipped gin file refers to
  either (so a pair file may set ``EVAL_TASK`` for ``runs/eval.gin`` while
  running ``runs/decode.gin``), naming where it was set and listing the
  macros the configuration does use.
"""

from __future__ import annotations

import difflib
import glob
import io
import os
import re
import tokenize
from typing import Mapping, Sequence

import gin

_OPEN = {"(": ")", "[": "]", "{": "}"}
_CLOSE = {v: k for k, v in _OPEN.items()}
_REF = re.compile(r"%([A-Za-z_][\w.]*)")


def check_brackets(text: str, where: str) -> None:
  """Raises ValueError naming ``where``:line for an unbalanced bracket.

  Args:
    text: gin source (a file or one binding).
    where: how to name it: a file path or "binding 'GAMMA = (3'".
  """
  multi = "\n" in text.strip()
  at = lambda line: f"{where}:{line}" if multi or not where.startswith(
      "binding") else where
  stack = []
  try:
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
      if tok.type != tokenize.OP:
        continue
      line, col = tok.start
      if tok.string in _OPEN:
        stack.append((tok.string, line, col))
      elif tok.string in _CLOSE:
        if not stack or stack[-1][0] != _CLOSE[tok.string]:
          raise ValueError(f"{at(line)}: unmatched {tok.string!r} at "
                           f"column {col + 1}")
        stack.pop()
  except tokenize.TokenError as e:
    if stack:
      char, line, col = stack[-1]
      raise ValueError(f"{at(line)}: {char!r} at column {col + 1} is never "
                       f"closed") from None
    line = e.args[1][0] if len(e.args) > 1 else "?"
    raise ValueError(f"{at(line)}: {e.args[0]} (an unterminated string?)"
                     ) from None
  if stack:
    char, line, col = stack[-1]
    raise ValueError(f"{at(line)}: {char!r} at column {col + 1} is never "
                     f"closed")


def defined_macros() -> set[str]:
  """Names of the macros bound in gin's current configuration."""
  return {scope for scope, sel in gin.config._CONFIG if sel == "gin.macro"}  # pylint: disable=protected-access


def referenced_macros() -> set[str]:
  """Names of the macros that some binding refers to (``%NAME``)."""
  refs = gin.config.iterate_references(gin.config._CONFIG)  # pylint: disable=protected-access
  return {ref.config_key[0] for ref in refs
          if ref.config_key[1] == "gin.macro"}


def shipped_references(dirs: Sequence[str]) -> set[str]:
  """Every ``%NAME`` in the gin files under ``dirs`` (recursively)."""
  names = set()
  for d in dirs:
    for path in glob.glob(os.path.join(d, "**", "*.gin"), recursive=True):
      with open(path, encoding="utf-8", errors="replace") as f:
        names.update(m.group(1) for m in _REF.finditer(f.read()))
  return names


def _line_of(name: str, path: str) -> str:
  """'path:line' of ``NAME = ...`` in a file (the path alone if absent)."""
  pattern = re.compile(rf"^\s*{re.escape(name)}\s*=")
  try:
    with open(path, encoding="utf-8", errors="replace") as f:
      for n, line in enumerate(f, 1):
        if pattern.match(line):
          return f"{path}:{n}"
  except OSError:
    pass
  return path


def check_macros(sources: Mapping[str, str], dirs: Sequence[str]) -> None:
  """Raises ValueError for a macro that nothing refers to (a typo).

  Args:
    sources: {macro name: where it was set}: a gin file path or
      "binding 'NAME = ...'".
    dirs: directories of gin files whose ``%NAME`` references make a macro
      known even when the current configuration does not read it.
  """
  used = referenced_macros()
  known = used | shipped_references(dirs)
  unknown = sorted(m for m in defined_macros() if m not in known)
  if not unknown:
    return
  name = unknown[0]
  src = sources.get(name, "a gin file")
  if not src.startswith("binding"):
    src = _line_of(name, src)
  close = difflib.get_close_matches(name, sorted(used), n=1)
  hint = f"; did you mean {close[0]}?" if close else ""
  others = (f" (and {len(unknown) - 1} more: {', '.join(unknown[1:])})"
            if len(unknown) > 1 else "")
  raise ValueError(f"unknown gin macro {name} (set in {src}): no binding uses "
                   f"it, so it would be ignored{hint}{others}. Known macros: "
                   f"{', '.join(sorted(used)) or 'none'}")


def parse(paths: Sequence[str], bindings: Sequence[str],
          known_dirs: Sequence[str]) -> None:
  """Parses gin files then bindings, strictly (see the module docstring).

  Args:
    paths: resolved gin file paths, in order.
    bindings: binding strings, in order.
    known_dirs: gin directories whose macro references count as known.
  """
  for path in paths:
    with open(path, "rb") as f:
      raw = f.read()
    try:
      text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
      line = raw[:e.start].count(b"\n") + 1
      raise ValueError(f"{path}:{line}: not valid UTF-8 (byte "
                       f"0x{raw[e.start]:02x}); save the gin file as UTF-8"
                       ) from None
    check_brackets(text, path)
  for b in bindings:
    check_brackets(b, f"binding {b!r}")
  sources: dict[str, str] = {}
  for path in paths:
    before = defined_macros()
    gin.parse_config_file(path)
    for m in defined_macros() - before:
      sources.setdefault(m, path)
  if bindings:
    gin.parse_config(list(bindings))
  for b in bindings:
    m = re.match(r"\s*([A-Za-z_][\w.]*)\s*=", b)
    if m:
      sources[m.group(1)] = f"binding {b.strip()!r}"
  check_macros(sources, known_dirs)
  gin.finalize()


__all__ = ["check_brackets", "check_macros", "defined_macros", "parse",
           "referenced_macros", "shipped_references"]
