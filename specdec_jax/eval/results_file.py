"""An append-only JSONL results file with crash-safe appends.

The file of ``harness.run`` sweeps and of ``specdec_jax decode``: one JSON
object per line, each with a unique 'key'. Appends are one ``os.write`` +
``fsync``; a torn last line (the writer was killed mid-line) is cut off on
open; one writer at a time (an exclusive ``flock``).
"""

from __future__ import annotations

import fcntl
import json
import os
import warnings
from typing import Mapping


class ResultsFile:
  """An append-only JSONL results file with crash-safe appends.

  Open it with ``with ResultsFile(path) as f``: the file is locked
  (exclusive ``flock``), a torn last line is truncated away, and ``f.rows`` /
  ``f.keys`` hold what is already there. :meth:`append` writes one row with
  a single ``os.write`` and ``fsync``.
  """

  def __init__(self, path: str, sync: bool = True):
    self.path = os.fspath(path)
    self.sync = sync
    self.rows: list[dict] = []
    self.keys: set[str] = set()
    self._fd = None

  def __enter__(self) -> "ResultsFile":
    parent = os.path.dirname(os.path.abspath(self.path))
    os.makedirs(parent, exist_ok=True)
    fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      os.close(fd)
      raise RuntimeError(f"{self.path} is being written by another process; "
                         f"wait for it or use another results file") from None
    self._fd = fd
    self.rows, good_bytes = _parse(self.path)
    if good_bytes < os.fstat(fd).st_size:
      warnings.warn(f"{self.path}: dropping a torn last line (the previous "
                    f"run was interrupted while writing it)")
      os.ftruncate(fd, good_bytes)
      os.fsync(fd)
    self.keys = {r["key"] for r in self.rows}
    return self

  def __exit__(self, *exc) -> None:
    if self._fd is not None:
      fcntl.flock(self._fd, fcntl.LOCK_UN)
      os.close(self._fd)
      self._fd = None

  def append(self, row: Mapping) -> None:
    """Writes one row (must have a new 'key') durably."""
    if self._fd is None:
      raise RuntimeError("open the ResultsFile with 'with' before appending")
    key = row["key"]
    if key in self.keys:
      raise ValueError(f"row {key!r} is already in {self.path}")
    data = (json.dumps(row, ensure_ascii=False, allow_nan=True) + "\n").encode()
    n = os.write(self._fd, data)
    if n != len(data):  # a short write: cut it off and fail loudly
      os.ftruncate(self._fd, os.fstat(self._fd).st_size - n)
      raise OSError(f"short write to {self.path} ({n} of {len(data)} bytes)")
    if self.sync:
      os.fsync(self._fd)
    self.rows.append(dict(row))
    self.keys.add(key)

  def replace_rows(self, rows: list[Mapping]) -> None:
    """Rewrites the file to hold exactly ``rows`` (keys unique), durably.

    Used when a resumed decode drops rows of requests that were deleted or
    edited. The file stays locked; a crash mid-rewrite can only lose rows
    (they are decoded again), never mix them up.
    """
    if self._fd is None:
      raise RuntimeError("open the ResultsFile with 'with' before rewriting")
    data = b"".join((json.dumps(r, ensure_ascii=False, allow_nan=True) +
                     "\n").encode() for r in rows)
    os.ftruncate(self._fd, 0)
    view = memoryview(data)
    while view:
      view = view[os.write(self._fd, view):]
    if self.sync:
      os.fsync(self._fd)
    self.rows = [dict(r) for r in rows]
    self.keys = {r["key"] for r in rows}


def _parse(path: str) -> tuple[list[dict], int]:
  """Rows of a results file and the byte length of its intact prefix.

  A last line without its newline is torn (not counted): a killed writer
  leaves a prefix of its line. A complete line that is not a valid row is an
  error: the file was edited or written by something else.
  """
  with open(path, "rb") as f:
    data = f.read()
  rows, pos, seen = [], 0, set()
  lines = data.split(b"\n")
  # Every complete line ends with "\n"; lines[-1] is what follows the last
  # newline: empty, or a torn row that is dropped.
  for i, line in enumerate(lines[:-1]):
    try:
      row = json.loads(line)
      if not isinstance(row, dict) or "key" not in row:
        raise ValueError("not a results row (no 'key')")
    except ValueError as e:
      raise ValueError(f"{path}:{i + 1}: corrupt results line ({e}); fix or "
                       f"delete it (only a torn LAST line is repaired "
                       f"automatically)") from None
    if row["key"] in seen:
      warnings.warn(f"{path}:{i + 1}: duplicate key {row['key']!r} ignored")
    else:
      seen.add(row["key"])
      rows.append(row)
    pos += len(line) + 1
  return rows, pos


def load_rows(path: str) -> list[dict]:
  """The complete rows of a results file (read-only; a torn tail ignored)."""
  return _parse(path)[0] if os.path.exists(path) else []


def machine() -> dict:
  """Where a benchmark ran: backend, devices, CPU, jax version, load average
  (1/5/15 min, at the time of the call)."""
  import platform  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  try:
    load = [round(x, 2) for x in os.getloadavg()]
  except OSError:
    load = None
  return dict(backend=jax.default_backend(),
              device=str(jax.devices()[0].device_kind),
              cpu=platform.processor() or platform.machine(),
              cpu_count=os.cpu_count(), jax=jax.__version__,
              load_average=load)


def write_report(out: str, *, command: str, markdown: str, rows,
                 meta: Mapping | None = None,
                 extra: Mapping | None = None) -> tuple[str, str]:
  """Writes a benchmark's ``<out>.json`` and ``<out>.md``.

  The JSON is ``{"meta": {command, machine..., **meta}, "rows": rows}``; the
  markdown is ``markdown`` followed by one line naming the command and the
  machine (backend, CPU, jax, load average when the run ended), so every
  committed result says how it was made and how loaded the machine was.

  Args:
    out: output path without extension (its folder is created).
    command: the command line that produced the result.
    markdown: the report body (a title line first).
    rows: JSON-serialisable result rows.
    meta: extra metadata for the JSON.
    extra: more top-level JSON keys (a script's established layout).

  Returns:
    (json path, markdown path).
  """
  if not out or out.endswith((".json", ".md")):
    raise ValueError(f"out must be a path without extension (the writer adds"
                     f" .json and .md), got {out!r}")
  info = {"command": command, **machine(), **(meta or {})}
  parent = os.path.dirname(os.path.abspath(out))
  os.makedirs(parent, exist_ok=True)
  with open(out + ".json", "w") as f:
    json.dump({**(extra or {}), "meta": info, "rows": list(rows)}, f,
              indent=1, default=float)
  foot = (f"\nMeasured with `{command}` on {info['backend']} "
          f"({info['device']}, {info['cpu']}, {info['cpu_count']} cores), jax "
          f"{info['jax']}; load average (1/5/15 min) at the end: "
          f"{info['load_average']}.\n")
  with open(out + ".md", "w") as f:
    f.write(markdown.rstrip("\n") + "\n" + foot)
  return out + ".json", out + ".md"
