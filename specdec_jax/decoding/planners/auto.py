"""The ``auto`` strategy: a tuned table batch size -> strategy, and its file.

``planners.tune`` (``tune.py``) measures candidate strategies on this
machine and returns an :class:`AutoTable`; ``decoding.decode('auto', ...,
tune=table_or_path)`` and ``specdec_jax decode`` with ``run.strategy =
'auto'`` run the row of the batch they decode:

    ROW RULE: the row of the LARGEST tuned batch size <= the batch decoded
    (a batch of 5 on a table tuned at 1 and 8 runs the batch-1 row); a
    batch smaller than every tuned size is an error (tune that size).

A row names its choice (a method NAME + knobs, a structure, and which of
the given models it uses, cheapest first) so it can be written to, and read
back from, a gin strategy file (``to_gin`` / ``load``): one binding per
field, Python literals only, so the library reads it without gin and the
CLI includes it as a gin file (``auto_table.*`` bindings, main.py).

Worked example: rows at batch 1 (chain gamma 4 over models (0, 1), 310.2
tokens/s against 200.0 for target-only) and batch 8 (target-only). A batch
of 3 runs ``Strategy.of('spec_decode', Chain(4), sampling)`` on models[0],
models[1]; a batch of 8 or 64 runs target-only.
"""

from __future__ import annotations

import ast
import dataclasses
import os
from typing import Any, Sequence

from specdec_jax.decoding.rules import sampling as sampling_lib
from specdec_jax.decoding.strategy import Chain, Stack, Strategy
from specdec_jax.decoding.verify.topology import Topology
from specdec_jax.decoding.verify.tree import Tree

OBJECTIVES = ("latency", "quality")
LOSSLESS = ("target_only", "spec_decode")


@dataclasses.dataclass(frozen=True)
class Candidate:
  """One way to decode, as tune measures it and the table stores it.

  Attributes:
    method: registry name ('target_only', 'spec_decode', a cascade...).
    structure: Chain / Tree / Stack.
    levels: indices of the models it runs, cheapest first, the target last
      (target-only: just the target).
    knobs: ((name, value), ...) method knobs (e.g. (('alpha', 0.3),)).
  """

  method: str
  structure: Any = Chain(1)
  levels: tuple[int, ...] = (0, 1)
  knobs: tuple[tuple[str, float], ...] = ()

  @property
  def lossless(self) -> bool:
    return self.method in LOSSLESS

  @property
  def label(self) -> str:
    """A short readable name ('target_only', 'chain:4', 'tree:6n/d2',
    'stack:2,4', 'token_v3(alpha=0.3) chain:4')."""
    if self.method == "target_only":
      return "target_only"
    s = self.structure
    if isinstance(s, Chain):
      shape = f"chain:{s.gamma}"
    elif isinstance(s, Tree):
      shape = f"tree:{s.topology.num_nodes}n/d{s.topology.max_depth}"
    else:
      shape = "stack:" + ",".join(map(str, s.buffers))
    if len(self.levels) == 2 and self.levels[0] != 0:
      shape += f"@{self.levels[0]}"
    if self.method == "spec_decode":
      return shape
    knobs = ",".join(f"{k}={v:g}" for k, v in self.knobs)
    return f"{self.method}({knobs}) {shape}"

  def strategy(self, sampling=None) -> Strategy:
    """The decoding.Strategy of this candidate at ``sampling``."""
    return Strategy.of(self.method, self.structure, sampling,
                       **dict(self.knobs))

  def to_dict(self) -> dict:
    s = self.structure
    d = {"method": self.method, "levels": list(self.levels),
         "knobs": dict(self.knobs)}
    if isinstance(s, Chain):
      d["chain"] = s.gamma
    elif isinstance(s, Tree):
      d["tree"] = list(s.topology.parents)
      d["proposal"] = s.proposal
    elif isinstance(s, Stack):
      if s.lenient_map():
        raise ValueError("a tuned stack has exact levels only")
      d["stack"] = list(s.buffers)
    return d

  @classmethod
  def from_dict(cls, d: dict) -> "Candidate":
    if "tree" in d:
      structure = Tree(Topology(tuple(d["tree"])),
                       d.get("proposal", "without_replacement"))
    elif "stack" in d:
      structure = Stack(tuple(d["stack"]))
    else:
      structure = Chain(int(d.get("chain", 1)))
    return cls(d["method"], structure, tuple(d["levels"]),
               tuple(sorted(d.get("knobs", {}).items())))


@dataclasses.dataclass(frozen=True)
class Measured:
  """A candidate's numbers at one batch size.

  Attributes:
    candidate: what was run.
    tps: measured tokens/s (median over repeats).
    ratio: median over repeats of tps / target-only tps, timed back to back.
    predicted_tps: the CostModel's tokens/s (None: not priced).
    quality: agreement with target-only output in [0, 1] (1 for lossless
      methods; None: not measured).
  """

  candidate: Candidate
  tps: float
  ratio: float
  predicted_tps: float | None = None
  quality: float | None = None

  def to_dict(self) -> dict:
    return {**self.candidate.to_dict(), "tps": float(self.tps),
            "ratio": float(self.ratio),
            "predicted_tps": None if self.predicted_tps is None else float(
                self.predicted_tps),
            "quality": None if self.quality is None else float(self.quality)}

  @classmethod
  def from_dict(cls, d: dict) -> "Measured":
    return cls(Candidate.from_dict(d), float(d["tps"]), float(d["ratio"]),
               d.get("predicted_tps"), d.get("quality"))


@dataclasses.dataclass(frozen=True)
class Row:
  """The choice at one batch size.

  Attributes:
    batch: batch size tuned.
    choice: the chosen candidate's numbers.
    target_only_tps: target-only tokens/s measured in the same run.
    candidates: every candidate measured (the choice among them).
  """

  batch: int
  choice: Measured
  target_only_tps: float
  candidates: tuple[Measured, ...] = ()


@dataclasses.dataclass(frozen=True)
class AutoTable:
  """Batch size -> strategy, with the objective it was tuned for.

  Attributes:
    rows: one Row per tuned batch size, ascending.
    objective: 'latency' (fastest lossless) or 'quality'.
    latency_budget: objective 'quality': most seconds per token allowed,
      relative to target-only (0.8: at least 1.25x its tokens/s); None.
    quality_floor: objective 'quality': least agreement with target-only
      output allowed (the fastest candidate reaching it is chosen); None.
    temperature: sampling temperature the table was tuned at (0: greedy).
    quality_metric: how quality was measured.
  """

  rows: tuple[Row, ...]
  objective: str = "latency"
  latency_budget: float | None = None
  quality_floor: float | None = None
  temperature: float = 0.0
  quality_metric: str = "agreement"

  def __post_init__(self):
    check_objective(self.objective, self.latency_budget, self.quality_floor)
    if not self.rows:
      raise ValueError("an AutoTable needs at least one row (tune at least "
                       "one batch size)")
    batches = [r.batch for r in self.rows]
    if batches != sorted(set(batches)):
      raise ValueError(f"AutoTable rows must have distinct ascending batch "
                       f"sizes, got {batches}")

  @property
  def batches(self) -> tuple[int, ...]:
    return tuple(r.batch for r in self.rows)

  def row_for(self, batch: int) -> Row:
    """The row of the largest tuned batch size <= ``batch``."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
      raise ValueError(f"batch must be an integer >= 1, got {batch!r}")
    fit = [r for r in self.rows if r.batch <= batch]
    if not fit:
      raise ValueError(f"batch size {batch} is not covered by the auto "
                       f"table (tuned batch sizes {list(self.batches)}; a "
                       f"row serves its batch size and larger ones); tune "
                       f"with batch size {batch} too")
    return fit[-1]

  def select(self, models: Sequence, params: Sequence, batch: int,
             sampling=None):
    """(strategy, models, params) of the row for ``batch``.

    Args:
      models, params: every model the table was tuned with, cheapest
        first, the target last.
      batch: rows decoded.
      sampling: overrides the table's (Temperature(temperature)).
    """
    cand = self.row_for(batch).choice.candidate
    if max(cand.levels) >= len(models) or len(models) != len(params):
      raise ValueError(f"the auto row for batch {batch} ({cand.label}) uses "
                       f"models {list(cand.levels)}, but {len(models)} "
                       f"model(s) and {len(params)} parameter set(s) were "
                       f"given; pass the models the table was tuned with, "
                       f"cheapest first")
    if sampling is None:
      sampling = sampling_lib.Temperature(self.temperature)
    levels = cand.levels
    if cand.method == "target_only":  # decode's (drafter, verifier) form
      levels = (levels[-1], levels[-1])
    return (cand.strategy(sampling), [models[i] for i in levels],
            [params[i] for i in levels])

  def pair_choice(self, batch: int):
    """(method name, knobs, gamma, tree) of the row for ``batch`` for
    entry points that decode a drafter/verifier pair (the CLI, the t5x
    Models); ``tree`` is None for a chain. A hierarchy row is refused."""
    cand = self.row_for(batch).choice.candidate
    if len(cand.levels) > 2:
      raise ValueError(f"the auto row for batch {batch} is a hierarchy "
                       f"({cand.label}); this entry point decodes a pair: "
                       f"tune the pair without stacks, or decode the "
                       f"family with decoding.decode('auto', ...)")
    if isinstance(cand.structure, Tree):
      return cand.method, dict(cand.knobs), 5, cand.structure
    return cand.method, dict(cand.knobs), cand.structure.gamma, None

  def to_gin(self, note: str = "") -> str:
    """The table as a gin strategy file (``load`` reads it back)."""
    lines = [f"# {ln}" if ln else "#" for ln in note.splitlines()]
    lines += ["# auto strategy table (specdec_jax tune); rule: a batch runs "
              "the row of the", "# largest tuned batch size <= it.", "#",
              "# batch  choice                         tokens/s  "
              "target-only  speedup  predicted"]
    for r in self.rows:
      c = r.choice
      pred = "-" if c.predicted_tps is None else f"{c.predicted_tps:.1f}"
      lines.append(f"# {r.batch:<6} {c.candidate.label:<30} {c.tps:>8.1f}  "
                   f"{r.target_only_tps:>11.1f}  {c.ratio:>6.2f}x  {pred:>9}")
    lines += [
        f"auto_table.objective = {self.objective!r}",
        f"auto_table.latency_budget = {self.latency_budget!r}",
        f"auto_table.quality_floor = {self.quality_floor!r}",
        f"auto_table.temperature = {float(self.temperature)!r}",
        f"auto_table.quality_metric = {self.quality_metric!r}",
        "auto_table.rows = ["]
    for r in self.rows:
      lines.append("    " + repr({
          "batch": r.batch, "choice": r.choice.to_dict(),
          "target_only_tps": float(r.target_only_tps),
          "candidates": [m.to_dict() for m in r.candidates]}) + ",")
    lines.append("]")
    return "\n".join(lines) + "\n"

  def save(self, path: str, note: str = "") -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
      f.write(self.to_gin(note))

  @classmethod
  def from_bindings(cls, objective="latency", latency_budget=None,
                    quality_floor=None, temperature=0.0,
                    quality_metric="agreement", rows=()) -> "AutoTable":
    """The table of the file's ``auto_table.*`` values (plain literals)."""
    try:
      built = tuple(Row(int(r["batch"]), Measured.from_dict(r["choice"]),
                        float(r["target_only_tps"]),
                        tuple(Measured.from_dict(m)
                              for m in r.get("candidates", ())))
                    for r in rows)
    except (KeyError, TypeError, ValueError) as e:
      raise ValueError(f"bad auto_table.rows entry ({e}); write the file "
                       f"with `specdec_jax tune`") from None
    return cls(built, objective, latency_budget, quality_floor,
               float(temperature), quality_metric)

  @classmethod
  def from_gin(cls, text: str, source: str = "<text>") -> "AutoTable":
    """Parses ``to_gin``'s text (no gin needed: literal bindings only)."""
    values, key, buf = {}, None, []

    def flush():
      if key is not None:
        try:
          values[key] = ast.literal_eval("\n".join(buf).strip())
        except (ValueError, SyntaxError):
          raise ValueError(f"{source}: auto_table.{key} is not a Python "
                           f"literal; write the file with `specdec_jax "
                           f"tune`") from None

    for line in text.splitlines():
      if line.lstrip().startswith("#") or not line.strip():
        continue
      if line.startswith("auto_table.") and "=" in line:
        flush()
        name, value = line.split("=", 1)
        key, buf = name.strip()[len("auto_table."):], [value]
      elif key is None:
        raise ValueError(f"{source}: not an auto strategy file (expected "
                         f"auto_table.* bindings, got {line.strip()!r})")
      else:
        buf.append(line)
    flush()
    if "rows" not in values:
      raise ValueError(f"{source}: no auto_table.rows; write the file with "
                       f"`specdec_jax tune`")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
      raise ValueError(f"{source}: unknown auto_table field(s) {unknown}")
    return cls.from_bindings(**values)


def load(path: str) -> AutoTable:
  """Reads a tune file (``AutoTable.save`` / ``specdec_jax tune``)."""
  try:
    with open(path) as f:
      text = f.read()
  except OSError as e:
    raise ValueError(f"cannot read the tune file {path!r} ({e.strerror or e})"
                     f"; write one with `specdec_jax tune --gin.OUTPUT=...`"
                     ) from None
  return AutoTable.from_gin(text, path)


def as_table(tune) -> AutoTable:
  """An AutoTable from a table or a tune file path."""
  if isinstance(tune, AutoTable):
    return tune
  if isinstance(tune, (str, os.PathLike)):
    return load(os.fspath(tune))
  raise ValueError(f"strategy='auto' needs tune= an AutoTable (planners."
                   f"tune(...)) or the path of a tune file, got "
                   f"{type(tune).__name__}")


def check_objective(objective: str, latency_budget, quality_floor) -> None:
  """Raises ValueError for an unknown objective or missing/extra knobs."""
  if objective not in OBJECTIVES:
    raise ValueError(f"unknown objective {objective!r}; use 'latency' "
                     f"(fastest lossless strategy) or 'quality' (with "
                     f"latency_budget or quality_floor)")
  if objective == "latency":
    if latency_budget is not None or quality_floor is not None:
      raise ValueError("objective 'latency' chooses lossless strategies "
                       "only; latency_budget / quality_floor need objective"
                       " 'quality'")
    return
  if (latency_budget is None) == (quality_floor is None):
    raise ValueError("objective 'quality' needs exactly one of "
                     "latency_budget (most seconds per token relative to "
                     "target-only, e.g. 0.8) or quality_floor (least "
                     "agreement with target-only output, e.g. 0.9)")
  if latency_budget is not None and not (
      isinstance(latency_budget, (int, float)) and latency_budget > 0):
    raise ValueError(f"latency_budget must be a number > 0 (seconds per "
                     f"token relative to target-only), got "
                     f"{latency_budget!r}")
  if quality_floor is not None and not (
      isinstance(quality_floor, (int, float)) and 0 <= quality_floor <= 1):
    raise ValueError(f"quality_floor must be in [0, 1], got "
                     f"{quality_floor!r}")


__all__ = ["AutoTable", "Candidate", "LOSSLESS", "Measured", "OBJECTIVES",
           "Row", "as_table", "check_objective", "load"]
