"""``verify(path)``: read every tensor of a checkpoint and check it.

    report = checkpoints.verify("/ckpt/gemma2-2b-hf")
    print(report.table())      # per tensor: shape, dtype, min/max/mean/std
    report.ok                  # False on a checksum mismatch or NaN/inf
    report.problems            # one line per problem, naming the tensor

Checks, tensor by tensor, in the checkpoint's own names (``checksums.py``):

* the checksum, when the checkpoint has a ``checksums.json`` (every
  checkpoint specdec_jax saves has one);
* finiteness: any NaN or +-inf is a problem;
* statistics (min, max, mean, std, computed in float64 over 16M-element
  chunks so a huge tensor is not copied): an all-zero tensor or one with
  ``|x| > 1e6`` gets a warning (plausible weights are neither; a warning
  does not fail the check).

It reads one tensor at a time and needs no model or preset, so it works on
foreign checkpoints of any supported format (native, HF safetensors, T5X
legacy and Orbax, official Gemma).
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Callable, Iterator

import numpy as np

from specdec_jax.checkpoints import (checksums, gemma_official, hf, loader,
                                     native)

HUGE = 1e6
_CHUNK = 1 << 24


@dataclasses.dataclass
class TensorStats:
  """What :func:`verify` found in one tensor.

  Attributes:
    name: the stored name (see ``checksums.py``).
    shape, dtype: as stored.
    min, max, mean, std: over the finite values (nan if there are none).
    nonfinite: number of NaN / inf values.
    checksum: 'ok', 'MISMATCH' or '-' (no manifest entry).
  """

  name: str
  shape: tuple[int, ...]
  dtype: str
  min: float
  max: float
  mean: float
  std: float
  nonfinite: int
  checksum: str


@dataclasses.dataclass
class VerifyReport:
  """The result of :func:`verify`.

  Attributes:
    path: the checkpoint.
    format: its format ('native', 'hf', 't5x', 't5x_orbax', 'gemma').
    manifest: the checksum manifest file, or None.
    tensors: one TensorStats per tensor, in stored-name order.
    problems: errors (checksum mismatch, non-finite values, unreadable).
    warnings: suspicious but not wrong (all zeros, huge values).
  """

  path: str
  format: str
  manifest: str | None
  tensors: list[TensorStats]
  problems: list[str]
  warnings: list[str]

  @property
  def ok(self) -> bool:
    return not self.problems

  def table(self) -> str:
    """A plain-text table of every tensor, then the verdict."""
    head = ["tensor", "shape", "dtype", "min", "max", "mean", "std",
            "nonfinite", "checksum"]
    num = lambda x: f"{x:.4g}"
    rows = [[t.name, "x".join(map(str, t.shape)) or "()", t.dtype,
             num(t.min), num(t.max), num(t.mean), num(t.std),
             str(t.nonfinite), t.checksum] for t in self.tensors]
    widths = [max([len(h)] + [len(r[i]) for r in rows])
              for i, h in enumerate(head)]
    line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths))
    out = [line(head), line(["-" * w for w in widths])] + [line(r)
                                                          for r in rows]
    out.append(self.summary())
    return "\n".join(out)

  def summary(self) -> str:
    sums = ("checksums: none (no checksums.json)" if self.manifest is None
            else f"checksums: {sum(t.checksum == 'ok' for t in self.tensors)}"
            f" of {len(self.tensors)} match")
    verdict = "OK" if self.ok else f"{len(self.problems)} PROBLEM(S)"
    return (f"{verdict}: {self.path} ({self.format}), {len(self.tensors)} "
            f"tensors; {sums}; {len(self.warnings)} warning(s)")


def tensor_stats(name: str, arr: np.ndarray, checksum: str) -> TensorStats:
  """Statistics of one tensor, chunk by chunk (no full float64 copy)."""
  flat = np.asarray(arr).reshape(-1)
  n, bad, total, total_sq = 0, 0, 0.0, 0.0
  lo, hi = math.inf, -math.inf
  for i in range(0, flat.size, _CHUNK):
    chunk = flat[i:i + _CHUNK].astype(np.float64)
    finite = np.isfinite(chunk)
    bad += int(chunk.size - finite.sum())
    good = chunk[finite]
    if good.size:
      n += good.size
      total += float(good.sum())
      total_sq += float(np.square(good).sum())
      lo, hi = min(lo, float(good.min())), max(hi, float(good.max()))
  mean = total / n if n else math.nan
  var = max(total_sq / n - mean * mean, 0.0) if n else math.nan
  return TensorStats(name, tuple(np.shape(arr)), np.dtype(arr.dtype).name,
                     lo if n else math.nan, hi if n else math.nan, mean,
                     math.sqrt(var) if n else math.nan, bad, checksum)


def _stored_tensors(path: str, fmt: str, subtree: str
                    ) -> tuple[str | None, Iterator[tuple[str, Callable]]]:
  """(manifest path, iterator of (stored name, read())) of a checkpoint."""
  from specdec_jax.checkpoints import t5x
  if fmt in ("native", "hf"):
    files = (hf.SafetensorsFiles([os.path.join(path, native.PARAMS)])
             if fmt == "native" else hf.SafetensorsFiles(hf.weight_files(path)))
    man = checksums.find(path)
    return man, ((n, lambda n=n: files[n]) for n in files.names())
  if fmt in ("t5x", "t5x_orbax"):
    kind, where = t5x.locate_t5x(path)
    man = t5x.find_manifest(kind, where)
    prefix = subtree.strip("/")
    leaves = t5x.t5x_leaves(path, subtree, verify_checksums=False)
    return man, ((f"{prefix}/{leaf.path}",
                  lambda leaf=leaf: loader.read_leaf(leaf, None, path))
                 for leaf in leaves)
  if fmt == "gemma":
    item = gemma_official.item_dir(path)
    man = gemma_official.item_manifest(item)
    reader = loader.OrbaxReader(item)
    return man, (("/".join(keys), lambda keys=keys: reader.read(keys))
                 for keys, _ in loader.orbax_leaves(reader.tree))
  raise ValueError(f"cannot verify {fmt!r} checkpoints; supported formats: "
                   f"native, hf, t5x, t5x_orbax, gemma")


def verify(path: str, *, format: str = "auto",  # pylint: disable=redefined-builtin
           subtree: str = "target") -> VerifyReport:
  """Reads every tensor of a checkpoint and checks it (module docstring).

  Args:
    path: the checkpoint (as for ``checkpoints.load``).
    format: 'auto' or one of native, hf, t5x, t5x_orbax, gemma.
    subtree: T5X only: the state subtree to check ('target': the parameters).

  Returns:
    A VerifyReport; ``report.ok`` is False when any tensor fails its
    checksum, holds NaN/inf or cannot be read. It raises only when the
    checkpoint cannot be opened at all (missing path, unknown format).
  """
  path = str(path)
  fmt = loader.detect_format(path) if format == "auto" else format
  man, tensors = _stored_tensors(path, fmt, subtree)
  problems, warnings, stats, names = [], [], [], set()
  for name, read in tensors:
    names.add(name)
    try:
      arr = np.asarray(read())
    except Exception as e:  # any reader error: report it, keep going
      problems.append(f"'{name}': cannot be read ({str(e).splitlines()[0]})")
      continue
    mark = "-"
    if man is not None:
      try:
        man.check(name, arr)
        mark = "ok"
      except checksums.ChecksumError as e:
        mark = "MISMATCH"
        problems.append(str(e))
    if not np.issubdtype(arr.dtype, np.number) and arr.dtype.kind != "V":
      warnings.append(f"'{name}' is {arr.dtype}, not a number array")
      continue
    s = tensor_stats(name, arr, mark)
    stats.append(s)
    if s.nonfinite:
      problems.append(f"'{name}' has {s.nonfinite} NaN/inf value(s) of "
                      f"{arr.size}")
    if arr.size > 1 and s.min == 0 and s.max == 0:
      warnings.append(f"'{name}' is all zeros")
    elif max(abs(s.min), abs(s.max)) > HUGE:
      warnings.append(f"'{name}' has values up to {max(abs(s.min), s.max):.3g}"
                      f" (|x| > {HUGE:g}; not plausible weights)")
  if man is not None:
    prefix = subtree.strip("/") + "/" if fmt.startswith("t5x") else ""
    missing = sorted(n for n in set(man.tensors) - names
                     if n.startswith(prefix))
    if missing:
      problems.append(f"{len(missing)} tensor(s) of the manifest are not in "
                      f"the checkpoint, first: '{missing[0]}'")
  return VerifyReport(path, fmt, None if man is None else man.path, stats,
                      problems, warnings)


__all__ = ["TensorStats", "VerifyReport", "tensor_stats", "verify"]
