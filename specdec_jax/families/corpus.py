"""The built-in tasks' data: functions of CPython's own standard library.

Every machine with Python has this corpus, so the default models train and
evaluate with nothing downloaded. From each ``.py`` file under the stdlib root
(``sysconfig.get_paths()['stdlib']``) we take every function or method that
has a docstring and a real body, and make two examples of it:

    't5_docstring'      inputs  = the function's source without its docstring
                                  (decorators, signature and body, dedented,
                                  at most ``MAX_SOURCE_CHARS`` of whole lines)
                        targets = the first sentence of its docstring
    'gemma_completion'  inputs  = decorators + signature + the docstring as
                                  written in the source, ending in a newline
                        targets = the first ``TARGET_LINES`` lines of the body
                                  (leading blank lines skipped; at most
                                  ``MAX_TARGET_CHARS``, ending at a line end)
    't5_codegen'        the 'gemma_completion' examples (same inputs,
                        targets and split) for the T5 family: text-to-code
                        as sequence-to-sequence

For example, from::

    def area(self):
        \"\"\"Return the area.

        More text.
        \"\"\"
        w = self.w
        return w * self.h

the T5 example is ``inputs = "def area(self):\\n    w = self.w\\n    return w
* self.h"``, ``targets = "Return the area."``; the Gemma example's inputs are
the first five lines (``def`` through the closing quotes, plus a newline) and
its targets ``"    w = self.w\\n    return w * self.h"``.

Filters (counted in :attr:`Corpus.stats`): directories in ``SKIP_DIRS``
(test suites, demos, installed third-party packages, generated data) and
build-specific ``_sysconfigdata*`` files are not read; files that do not
decode or parse are skipped; functions whose body is only the docstring (or
``pass`` / ``...``), or whose docstring shares a line with code, are skipped;
T5 targets that look like a call signature (``S.find(sub) -> int``), have
fewer than ``MIN_TARGET_WORDS`` words or more than ``MAX_SENTENCE_CHARS``
characters are dropped; Gemma prompts longer than ``MAX_PROMPT_CHARS`` and
bodies whose first line is longer than ``MAX_TARGET_CHARS`` are dropped.
Duplicates (same ``inputs``) are removed over the whole corpus, keeping the
first in sorted file order, so no example sits in two splits.

The split is by file: a stable hash of the path relative to the stdlib root
(and ``SPLIT_SEED``) puts every function of a file in the same split.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
import io
import json
import os
import re
import sysconfig
import tokenize
import warnings

TASKS = ("t5_docstring", "gemma_completion", "t5_codegen")
# Tasks whose examples are another task's (same inputs and targets).
SAME_EXAMPLES = {"t5_codegen": "gemma_completion"}
SPLITS = ("train", "validation", "test")
SPLIT_SEED = 0
# Percent of files in each split (the rest is train).
TEST_PERCENT = 10
VALIDATION_PERCENT = 5

SKIP_DIRS = frozenset({
    "test", "tests", "idle_test",  # test suites (and their broken fixtures)
    "turtledemo",  # demo scripts
    "site-packages",  # third-party packages: differ between machines
    "ensurepip", "pydoc_data", "__phello__",  # bundled / generated data
    "lib-dynload", "__pycache__",
})

MAX_SOURCE_CHARS = 600
MAX_SENTENCE_CHARS = 200
MIN_TARGET_WORDS = 2
MAX_PROMPT_CHARS = 800
TARGET_LINES = 2
MAX_TARGET_CHARS = 160

_SIGNATURE_DOC = re.compile(r"^[\w.]+\(.*\)\s*(->.*)?$")
_SENTENCE_END = re.compile(r"[.!?](?=\s|$)")
_ABBREVIATIONS = frozenset({"e.g", "i.e", "etc", "vs", "cf", "approx"})


@dataclasses.dataclass(frozen=True)
class Function:
  """One documented function, split into the parts the tasks use.

  Attributes:
    path: file path relative to the stdlib root ('/'-separated).
    qualname: dotted name ('Class.method', 'outer.<locals>.inner').
    lineno: 1-based line of its first decorator or of ``def``.
    signature: decorators and ``def`` line(s), dedented, ending in '\\n'.
    docstring_source: the docstring literal as written, dedented, no final
      newline.
    docstring: the cleaned docstring (``ast.get_docstring``).
    body: the body lines after the docstring, dedented, leading blank lines
      removed, trailing whitespace stripped.
  """

  path: str
  qualname: str
  lineno: int
  signature: str
  docstring_source: str
  docstring: str
  body: tuple[str, ...]

  @property
  def id(self) -> str:
    return f"{self.path}:{self.lineno}:{self.qualname}"


@dataclasses.dataclass(frozen=True)
class Corpus:
  """Both tasks' examples, split by file.

  Attributes:
    root: the stdlib directory read.
    files: relative paths of the files read, sorted.
    corpus_hash: SHA-256 over (path, SHA-256 of the file bytes) of ``files``.
    examples: {task: {split: [{'id', 'inputs', 'targets'}, ...]}}.
    stats: counts of files, functions and every filter.
  """

  root: str
  files: tuple[str, ...]
  corpus_hash: str
  examples: dict[str, dict[str, list[dict[str, str]]]]
  stats: dict[str, int]

  def examples_hash(self, task: str) -> str:
    """SHA-256 of the task's examples of all splits (canonical JSON)."""
    blob = json.dumps(self.examples[task], sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()


def stdlib_root() -> str:
  """The running interpreter's standard library directory."""
  return sysconfig.get_paths()["stdlib"]


def list_files(root: str) -> list[str]:
  """Relative '/'-joined paths of the corpus's ``.py`` files, sorted.

  Args:
    root: a stdlib-like directory.
  """
  if not os.path.isdir(root):
    raise ValueError(f"corpus root {root!r} is not a directory")
  out = []
  for d, dirs, names in os.walk(root):
    dirs[:] = [x for x in dirs if x not in SKIP_DIRS and
               not x.startswith("config-")]
    for name in names:
      if name.endswith(".py") and not name.startswith("_sysconfigdata"):
        rel = os.path.relpath(os.path.join(d, name), root)
        out.append(rel.replace(os.sep, "/"))
  return sorted(out)


def split_of(path: str, seed: int = SPLIT_SEED) -> str:
  """'train', 'validation' or 'test' for a relative file path (stable)."""
  digest = hashlib.sha256(f"{seed}:{path}".encode()).hexdigest()
  bucket = int(digest[:8], 16) % 100
  if bucket < TEST_PERCENT:
    return "test"
  if bucket < TEST_PERCENT + VALIDATION_PERCENT:
    return "validation"
  return "train"


def decode_source(data: bytes) -> str | None:
  """Bytes -> text with the file's declared encoding and '\\n' newlines."""
  try:
    encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    text = data.decode(encoding)
  except (SyntaxError, LookupError, UnicodeDecodeError):
    return None
  if text.startswith("\ufeff"):
    text = text[1:]
  return text.replace("\r\n", "\n").replace("\r", "\n")


def _dedent(line: str, indent: int) -> str:
  line = line.rstrip()
  return line[indent:] if line[:indent].strip() == "" else line.lstrip()


def _is_stub(stmt: ast.stmt) -> bool:
  return isinstance(stmt, ast.Pass) or (
      isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
      and stmt.value.value is Ellipsis)


def _functions(tree: ast.AST):
  """Yields (qualname, node) of every function in ``tree``, in source order."""
  out = []

  def visit(node, prefix):
    for child in ast.iter_child_nodes(node):
      if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
        name = prefix + child.name
        out.append((name, child))
        visit(child, name + ".<locals>.")
      elif isinstance(child, ast.ClassDef):
        visit(child, prefix + child.name + ".")
      else:
        visit(child, prefix)

  visit(tree, "")
  return sorted(out, key=lambda x: (x[1].lineno, x[1].col_offset))


def extract_functions(text: str, path: str,
                      stats: dict[str, int] | None = None) -> list[Function]:
  """Documented functions of one source file.

  Args:
    text: the file's source ('\\n' newlines).
    path: its relative path (stored in each Function).
    stats: optional counter dict updated with skip reasons.

  Returns:
    The functions with a docstring on its own lines and a non-stub body,
    in source order.
  """
  stats = {} if stats is None else stats
  count = lambda k: stats.__setitem__(k, stats.get(k, 0) + 1)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # SyntaxWarning: invalid escapes
    try:
      tree = ast.parse(text)
    except (SyntaxError, ValueError):
      count("files_unparsable")
      return []
  lines = text.split("\n")
  out = []
  for qualname, node in _functions(tree):
    count("functions")
    doc = ast.get_docstring(node)
    if not doc or not doc.strip():
      count("skip_no_docstring")
      continue
    first, rest = node.body[0], node.body[1:]
    if not rest or all(_is_stub(s) for s in rest):
      count("skip_stub_body")
      continue
    if first.lineno <= node.lineno or rest[0].lineno <= first.end_lineno:
      count("skip_docstring_shares_line")
      continue
    start = min([d.lineno for d in node.decorator_list] + [node.lineno])
    indent = node.col_offset
    ded = lambda a, b: [_dedent(x, indent) for x in lines[a - 1:b]]
    signature = ded(start, first.lineno - 1)
    body = ded(first.end_lineno + 1, node.end_lineno)
    while body and not body[0].strip():
      body.pop(0)
    out.append(Function(
        path=path, qualname=qualname, lineno=start,
        signature="\n".join(signature) + "\n",
        docstring_source="\n".join(ded(first.lineno, first.end_lineno)),
        docstring=doc, body=tuple(body)))
  return out


def first_sentence(docstring: str) -> str:
  """First sentence of the first paragraph, whitespace collapsed.

  A sentence ends at '.', '!' or '?' followed by whitespace or the end,
  except after the abbreviations 'e.g.', 'i.e.', 'etc.', 'vs.', 'cf.'.
  """
  para = []
  for line in docstring.strip().split("\n"):
    if not line.strip():
      break
    para.append(line.strip())
  text = " ".join(" ".join(para).split())
  for m in _SENTENCE_END.finditer(text):
    word = text[:m.start()].rsplit(" ", 1)[-1].lower()
    if word not in _ABBREVIATIONS:
      return text[:m.end()]
  return text


def docstring_example(fn: Function,
                      stats: dict[str, int] | None = None) -> dict | None:
  """The 't5_docstring' example of ``fn`` (None if a filter drops it)."""
  stats = {} if stats is None else stats
  count = lambda k: stats.__setitem__(k, stats.get(k, 0) + 1)
  first_line = fn.docstring.strip().split("\n")[0].strip()
  if _SIGNATURE_DOC.match(first_line):
    count("t5_skip_signature_docstring")
    return None
  target = first_sentence(fn.docstring)
  if len(target.split()) < MIN_TARGET_WORDS or not re.search(
      r"[A-Za-z]", target):
    count("t5_skip_short_target")
    return None
  if len(target) > MAX_SENTENCE_CHARS:
    count("t5_skip_long_target")
    return None
  source, n = fn.signature, len(fn.signature)
  for line in fn.body:
    if n + len(line) + 1 > MAX_SOURCE_CHARS:
      count("t5_truncated_source")
      break
    source += line + "\n"
    n += len(line) + 1
  return {"id": fn.id, "inputs": source.rstrip("\n"), "targets": target}


def completion_example(fn: Function,
                       stats: dict[str, int] | None = None) -> dict | None:
  """The 'gemma_completion' example of ``fn`` (None if a filter drops it)."""
  stats = {} if stats is None else stats
  count = lambda k: stats.__setitem__(k, stats.get(k, 0) + 1)
  prompt = fn.signature + fn.docstring_source + "\n"
  if len(prompt) > MAX_PROMPT_CHARS:
    count("gemma_skip_long_prompt")
    return None
  target = []
  for line in fn.body[:TARGET_LINES]:
    if not line.strip() or len("\n".join(target + [line])) > MAX_TARGET_CHARS:
      break
    target.append(line)
  if not target:
    count("gemma_skip_long_first_line")
    return None
  return {"id": fn.id, "inputs": prompt, "targets": "\n".join(target)}


def build(root: str | None = None, seed: int = SPLIT_SEED) -> Corpus:
  """Reads the stdlib (or any directory laid out like it) into both tasks.

  Args:
    root: directory to read; default :func:`stdlib_root`.
    seed: split seed (see :func:`split_of`).

  Returns:
    The Corpus. Deterministic for identical files.
  """
  root = stdlib_root() if root is None else root
  files = list_files(root)
  stats: dict[str, int] = {"files_listed": len(files)}
  h = hashlib.sha256()
  makers = {"t5_docstring": docstring_example,
            "gemma_completion": completion_example}
  examples = {t: {s: [] for s in SPLITS} for t in makers}
  seen = {t: set() for t in makers}
  for path in files:
    with open(os.path.join(root, path), "rb") as f:
      data = f.read()
    h.update(f"{path}\0{hashlib.sha256(data).hexdigest()}\n".encode())
    text = decode_source(data)
    if text is None:
      stats["files_undecodable"] = stats.get("files_undecodable", 0) + 1
      continue
    split = split_of(path, seed)
    for fn in extract_functions(text, path, stats):
      for task, make in makers.items():
        ex = make(fn, stats)
        if ex is None:
          continue
        if ex["inputs"] in seen[task]:
          stats[f"{task}_skip_duplicate"] = stats.get(
              f"{task}_skip_duplicate", 0) + 1
          continue
        seen[task].add(ex["inputs"])
        examples[task][split].append(ex)
  for task, same in SAME_EXAMPLES.items():
    examples[task] = {s: [dict(e) for e in examples[same][s]]
                      for s in SPLITS}
  for task in TASKS:
    for split in SPLITS:
      stats[f"{task}_{split}"] = len(examples[task][split])
  return Corpus(root=root, files=tuple(files), corpus_hash=h.hexdigest(),
                examples=examples, stats=dict(sorted(stats.items())))


@functools.lru_cache(maxsize=2)
def default_corpus(root: str | None = None) -> Corpus:
  """:func:`build` of the stdlib, cached per process."""
  return build(root)


__all__ = [
    "Corpus", "Function", "MAX_PROMPT_CHARS", "MAX_SOURCE_CHARS",
    "SAME_EXAMPLES", "SKIP_DIRS",
    "SPLITS", "TASKS", "build", "completion_example", "decode_source",
    "default_corpus", "docstring_example", "extract_functions",
    "first_sentence", "list_files", "split_of", "stdlib_root",
]
