"""Evaluation examples from local JSONL or TSV files (no TensorFlow).

Every example becomes ``{'id': str, 'inputs': str, 'targets': str | list}``
(``targets`` is absent when ``targets_key=None``, e.g. for decode-only runs).
Field names are configurable and may be dotted paths into nested JSON
(``targets_key='answers.text'`` reads ``record['answers']['text']``).

JSONL: one JSON object a line; blank lines are skipped. A target may be a
string or a list of strings (several references; an empty list is SQuAD
v2.0's "no answer").

TSV: tab-separated, no quoting (a field cannot hold a tab or newline). By
default the first line is a header naming the columns; pass
``fields=('inputs', 'targets')`` for files without one.

Ids are the record's ``id_key`` field when present, else
``'<file name>:<line number>'`` (1-based, counting every physical line), so
they are stable across runs and unique across the files of a glob.

    examples = load('squad.jsonl', inputs_key='question',
                    targets_key='answers')
"""

from __future__ import annotations

import glob as globlib
import json
import os
from typing import Any, Iterable, Iterator, Mapping, Sequence, TypedDict

FORMATS = ("jsonl", "tsv")


class Example(TypedDict, total=False):
  """One example: ``id`` and ``inputs`` always, ``targets`` if requested."""
  id: str
  inputs: str
  targets: str | list[str]


class DatasetError(ValueError):
  """A data file is malformed or lacks a field; the message says where."""


def resolve_paths(path_or_glob: str | Sequence[str]) -> list[str]:
  """Expands a path, a glob or a list of them into sorted existing files.

  Raises:
    FileNotFoundError: a path does not exist or a glob matches nothing.
  """
  patterns = ([path_or_glob] if isinstance(path_or_glob, (str, os.PathLike))
              else list(path_or_glob))
  if not patterns:
    raise FileNotFoundError("no data file given")
  paths = []
  for p in map(os.fspath, patterns):
    if globlib.has_magic(p):
      found = sorted(f for f in globlib.glob(p) if os.path.isfile(f))
      if not found:
        raise FileNotFoundError(f"the pattern {p!r} matches no file")
      paths.extend(found)
    elif os.path.isfile(p):
      paths.append(p)
    else:
      raise FileNotFoundError(f"data file {p!r} does not exist")
  return paths


def infer_format(path: str) -> str:
  """'jsonl' for .jsonl/.json, 'tsv' for .tsv/.txt; else an error."""
  ext = os.path.splitext(path)[1].lower()
  fmt = {".jsonl": "jsonl", ".json": "jsonl", ".tsv": "tsv",
         ".txt": "tsv"}.get(ext)
  if fmt is None:
    raise ValueError(f"cannot tell the format of {path!r} from its extension; "
                     f"pass format= one of {FORMATS}")
  return fmt


def _get(record: Mapping[str, Any], key: str, where: str) -> Any:
  """``record[key]`` with dotted paths; DatasetError naming the key."""
  if key in record:  # a literal key wins over a dotted path
    return record[key]
  value = record
  for part in key.split("."):
    if not isinstance(value, Mapping) or part not in value:
      fields = sorted(record) if isinstance(record, Mapping) else []
      raise DatasetError(f"{where}: no field {key!r} (fields: {fields}); "
                         f"set the key argument to the right field name")
    value = value[part]
  return value


def _target(value: Any, key: str, where: str) -> str | list[str]:
  if isinstance(value, str):
    return value
  if isinstance(value, list) and all(isinstance(v, str) for v in value):
    return list(value)
  raise DatasetError(f"{where}: field {key!r} must be a string or a list of "
                     f"strings, got {json.dumps(value)[:80]}")


def iter_jsonl(path: str) -> Iterator[tuple[int, dict[str, Any]]]:
  """Yields (1-based line number, JSON object) for each non-blank line;
  DatasetError with ``file:line`` for a line that is not a JSON object."""
  with open(path, encoding="utf-8") as f:
    for lineno, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except json.JSONDecodeError as e:
        raise DatasetError(f"{path}:{lineno}: not valid JSON ({e.msg} at "
                           f"column {e.colno})") from None
      if not isinstance(record, dict):
        raise DatasetError(f"{path}:{lineno}: expected a JSON object, got "
                           f"{type(record).__name__}")
      yield lineno, record


def _records_tsv(path: str, fields: Sequence[str] | None):
  """Yields (line number, {column: value}) for each non-blank data line."""
  with open(path, encoding="utf-8", newline="") as f:
    names = list(fields) if fields is not None else None
    for lineno, line in enumerate(f, 1):
      line = line.rstrip("\r\n")
      if not line.strip():
        continue
      cells = line.split("\t")
      if names is None:  # the header line
        names = cells
        if len(set(names)) != len(names):
          raise DatasetError(f"{path}:{lineno}: duplicate column names in the "
                             f"header {names}")
        continue
      if len(cells) != len(names):
        raise DatasetError(f"{path}:{lineno}: {len(cells)} tab-separated "
                           f"fields, expected {len(names)} ({names})")
      yield lineno, dict(zip(names, cells))


def load(path_or_glob: str | Sequence[str], inputs_key: str = "inputs",
         targets_key: str | None = "targets", id_key: str = "id",
         format: str | None = None, fields: Sequence[str] | None = None,
         limit: int | None = None) -> list[Example]:
  """Loads examples from JSONL or TSV files.

  Args:
    path_or_glob: a file, a glob, or a list of them (read in sorted order).
    inputs_key: field holding the model input text.
    targets_key: field holding the reference(s); None to read inputs only.
    id_key: field holding the example id, if any (else derived).
    format: 'jsonl' or 'tsv'; None infers it from each file's extension.
    fields: TSV column names for files without a header line.
    limit: keep only the first ``limit`` examples.

  Returns:
    The examples, in file order.

  Raises:
    FileNotFoundError: a file is missing or a glob matches nothing.
    DatasetError: a malformed line, a missing field or a duplicate id; the
      message gives ``file:line``.
  """
  if format is not None and format not in FORMATS:
    raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
  if limit is not None and limit < 0:
    raise ValueError(f"limit must be >= 0, got {limit}")
  examples, seen = [], {}
  for path in resolve_paths(path_or_glob):
    fmt = format or infer_format(path)
    records = (iter_jsonl(path) if fmt == "jsonl"
               else _records_tsv(path, fields))
    for lineno, record in records:
      if limit is not None and len(examples) >= limit:
        return examples
      where = f"{path}:{lineno}"
      inputs = _get(record, inputs_key, where)
      if not isinstance(inputs, str):
        raise DatasetError(f"{where}: field {inputs_key!r} must be a string, "
                           f"got {json.dumps(inputs)[:80]}")
      ex_id = record.get(id_key)
      ex_id = f"{os.path.basename(path)}:{lineno}" if ex_id is None \
          else str(ex_id)
      if ex_id in seen:
        raise DatasetError(f"{where}: duplicate id {ex_id!r} (first at "
                           f"{seen[ex_id]}); ids must be unique")
      seen[ex_id] = where
      ex = Example(id=ex_id, inputs=inputs)
      if targets_key is not None:
        ex["targets"] = _target(_get(record, targets_key, where), targets_key,
                                where)
      examples.append(ex)
  return examples


def write_jsonl(path: str, records: Iterable[Mapping[str, Any]]) -> int:
  """Writes one JSON object a line (UTF-8, not ASCII-escaped).

  Creates missing parent directories and replaces the file atomically.

  Returns:
    The number of records written.
  """
  parent = os.path.dirname(os.path.abspath(path))
  os.makedirs(parent, exist_ok=True)
  tmp, n = f"{path}.tmp{os.getpid()}", 0
  try:
    with open(tmp, "w", encoding="utf-8") as f:
      for n, record in enumerate(records, 1):
        if not isinstance(record, Mapping):
          raise TypeError(f"record {n} must be a mapping, got "
                          f"{type(record).__name__}")
        f.write(json.dumps(record, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)
  return n
