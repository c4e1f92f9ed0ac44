"""Pretraining text for the default models: more code and prose than the task.

The tasks' training split (:mod:`specdec_jax.families.corpus`) has ~5,500
examples: too few for a model that should beat a smaller one. The default
models are therefore pretrained on plain text first, from two sources every
Python installation has:

    'stdlib'          every ``.py`` file of the standard library whose file
                      is in the TRAINING split (module code, classes,
                      comments: not only the task's functions)
    'site-packages'   text that installed pip packages ship: ``.py`` sources
                      (with their docstrings), ``.md`` / ``.rst`` / ``.txt``
                      documentation and the ``METADATA`` long descriptions
                      of ``*.dist-info``, under the interpreter's
                      site-packages (``sysconfig.get_paths()['purelib']``)

Selection is deterministic: the training-split stdlib files (sorted), then
the site-packages files in the order of a stable hash of their relative path
(``PRETRAIN_SEED``), until ``max_bytes`` of text; files outside
[``MIN_FILE_BYTES``, ``MAX_FILE_BYTES``], undecodable files and files whose
content was already taken are skipped. The list of files taken and the
SHA-256 of their contents are recorded (:attr:`PretrainCorpus.files_hash`).

No held-out text: a ``.py`` file with a function whose example inputs
(either task) equal a validation or test example's is dropped whole (pip
packages vendor copies of stdlib modules, e.g. setuptools' distutils), and
so is any file whose bytes equal a held-out stdlib file's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import sysconfig

from specdec_jax.families import corpus as corpus_lib

PRETRAIN_SEED = 0
SITE_EXTENSIONS = (".py", ".md", ".rst", ".txt")
SITE_NAMES = ("METADATA",)  # *.dist-info long descriptions
MIN_FILE_BYTES = 256
MAX_FILE_BYTES = 256 * 1024
DEFAULT_MAX_BYTES = 32 * 2**20
SKIP_SITE_DIRS = frozenset({"__pycache__"})
# This project's own distribution (its METADATA is our README, which changes
# with every release; editable installs add finder files): never training
# text, or the models would depend on the checkout's documentation.
SKIP_SITE_PREFIXES = ("specdec_jax", "__editable__")


@dataclasses.dataclass(frozen=True)
class Document:
  """One pretraining file.

  Attributes:
    source: 'stdlib' or 'site-packages'.
    path: '/'-joined path relative to the source root.
    sha256: SHA-256 of the file's bytes.
    text: the decoded text ('\\n' newlines).
  """

  source: str
  path: str
  sha256: str
  text: str

  @property
  def is_python(self) -> bool:
    return self.path.endswith(".py")


@dataclasses.dataclass(frozen=True)
class PretrainCorpus:
  """The selected documents.

  Attributes:
    stdlib_root, site_packages: the directories read (site_packages may be
      None: stdlib only).
    documents: the documents, in selection order.
    files_hash: SHA-256 over (source, path, sha256) of ``documents``.
    stats: counts and bytes of what was taken and skipped.
  """

  stdlib_root: str
  site_packages: str | None
  documents: tuple[Document, ...]
  files_hash: str
  stats: dict[str, int]

  def file_list(self) -> list[str]:
    """'source:path' of every document, in selection order."""
    return [f"{d.source}:{d.path}" for d in self.documents]


def site_packages_dir() -> str:
  """The running interpreter's site-packages (purelib) directory."""
  return sysconfig.get_paths()["purelib"]


def list_site_files(root: str) -> list[str]:
  """Candidate site-packages files ('/'-joined relative paths, sorted)."""
  if not os.path.isdir(root):
    raise ValueError(f"site-packages directory {root!r} does not exist; pass "
                     f"an existing one (or none for stdlib-only pretraining)")
  out = []
  for d, dirs, names in os.walk(root):
    dirs[:] = sorted(x for x in dirs if x not in SKIP_SITE_DIRS and not (
        d == root and x.startswith(SKIP_SITE_PREFIXES)))
    if d == root:
      names = [x for x in names if not x.startswith(SKIP_SITE_PREFIXES)]
    in_dist_info = d.endswith(".dist-info")
    for name in names:
      if name.endswith(SITE_EXTENSIONS) or (in_dist_info and
                                            name in SITE_NAMES):
        rel = os.path.relpath(os.path.join(d, name), root)
        out.append(rel.replace(os.sep, "/"))
  return sorted(out)


def _order_key(source: str, path: str) -> str:
  return hashlib.sha256(f"{PRETRAIN_SEED}:{source}:{path}".encode()
                        ).hexdigest()


def held_out_inputs(corpus: corpus_lib.Corpus) -> frozenset[str]:
  """The ``inputs`` of every validation and test example of both tasks."""
  return frozenset(e["inputs"] for task in corpus_lib.TASKS
                   for split in ("validation", "test")
                   for e in corpus.examples[task][split])


def _held_out_file_hashes(corpus: corpus_lib.Corpus) -> frozenset[str]:
  out = set()
  for path in corpus.files:
    if corpus_lib.split_of(path) != "train":
      with open(os.path.join(corpus.root, path), "rb") as f:
        out.add(hashlib.sha256(f.read()).hexdigest())
  return frozenset(out)


def contains_held_out(text: str, path: str, held_out: frozenset[str]) -> bool:
  """True if a function of ``text`` (Python) makes a held-out example."""
  for fn in corpus_lib.extract_functions(text, path):
    for make in (corpus_lib.docstring_example, corpus_lib.completion_example):
      ex = make(fn)
      if ex is not None and ex["inputs"] in held_out:
        return True
  return False


def _decode(data: bytes, path: str) -> str | None:
  if path.endswith(".py"):
    return corpus_lib.decode_source(data)
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError:
    return None
  return text.replace("\r\n", "\n").replace("\r", "\n")


def build(corpus: corpus_lib.Corpus, site_packages: str | None = None,
          max_bytes: int = DEFAULT_MAX_BYTES) -> PretrainCorpus:
  """Selects the pretraining documents (see the module docstring).

  Args:
    corpus: the task corpus (its root, split and held-out examples).
    site_packages: site-packages directory to read (None: stdlib only).
    max_bytes: stop adding files past this many bytes of text in total
      (the training-split stdlib files come first).

  Returns:
    PretrainCorpus. Deterministic for identical files.
  """
  held_out = held_out_inputs(corpus)
  held_out_files = _held_out_file_hashes(corpus)
  stats: dict[str, int] = {}
  count = lambda k, n=1: stats.__setitem__(k, stats.get(k, 0) + n)
  candidates = [("stdlib", p) for p in corpus.files
                if corpus_lib.split_of(p) == "train"]
  if site_packages is not None:
    site = list_site_files(site_packages)
    count("site_candidates", len(site))
    candidates += sorted((("site-packages", p) for p in site),
                         key=lambda sp: _order_key(*sp))
  docs, seen, total = [], set(held_out_files), 0
  for source, path in candidates:
    if total >= max_bytes:
      break
    root = corpus.root if source == "stdlib" else site_packages
    full = os.path.join(root, path)
    size = os.path.getsize(full)
    if source == "site-packages" and not (MIN_FILE_BYTES <= size <=
                                          MAX_FILE_BYTES):
      count("skip_size")
      continue
    with open(full, "rb") as f:
      data = f.read()
    digest = hashlib.sha256(data).hexdigest()
    if digest in seen:
      count("skip_duplicate_or_held_out_file")
      continue
    text = _decode(data, path)
    if text is None or not text.strip():
      count("skip_undecodable")
      continue
    if path.endswith(".py") and contains_held_out(text, path, held_out):
      count("skip_contains_held_out_example")
      continue
    seen.add(digest)
    docs.append(Document(source, path, digest, text))
    total += len(text.encode("utf-8"))
    count(f"{source}_files")
    count(f"{source}_bytes", len(text.encode("utf-8")))
  h = hashlib.sha256()
  for d in docs:
    h.update(f"{d.source}\0{d.path}\0{d.sha256}\n".encode())
  return PretrainCorpus(stdlib_root=corpus.root, site_packages=site_packages,
                        documents=tuple(docs), files_hash=h.hexdigest(),
                        stats=dict(sorted(stats.items())))


_EXAMPLE_MAKERS = {"t5_docstring": corpus_lib.docstring_example,
                   "gemma_completion": corpus_lib.completion_example,
                   "t5_codegen": corpus_lib.completion_example}


def task_examples(pre: PretrainCorpus, task: str,
                  exclude: frozenset[str] = frozenset()) -> list[dict]:
  """``task``-style examples of every Python document's functions.

  Args:
    pre: the pretraining corpus.
    task: a task of ``corpus.TASKS``.
    exclude: example inputs to leave out (held-out or already used ones).

  Returns:
    [{'id', 'inputs', 'targets'}] in document order, unique inputs.
  """
  if task not in _EXAMPLE_MAKERS:
    raise ValueError(f"task must be one of {sorted(_EXAMPLE_MAKERS)}, got "
                     f"{task!r}")
  make = _EXAMPLE_MAKERS[task]
  out, seen = [], set(exclude)
  for d in pre.documents:
    if not d.is_python:
      continue
    for fn in corpus_lib.extract_functions(d.text, f"{d.source}/{d.path}"):
      ex = make(fn)
      if ex is not None and ex["inputs"] not in seen:
        seen.add(ex["inputs"])
        out.append(ex)
  return out


def docstring_examples(pre: PretrainCorpus,
                       exclude: frozenset[str] = frozenset()) -> list[dict]:
  """'t5_docstring'-style examples of every Python document's functions
  (:func:`task_examples`)."""
  return task_examples(pre, "t5_docstring", exclude)


__all__ = [
    "DEFAULT_MAX_BYTES", "Document", "PRETRAIN_SEED", "PretrainCorpus",
    "build", "contains_held_out", "docstring_examples", "held_out_inputs",
    "list_site_files", "site_packages_dir", "task_examples",
]
