"""Runs decoding configurations over examples into a resumable JSONL file.

A :class:`RunConfig` is one point of a sweep: a method with its knobs, the
sampling settings, the draft structure (a chain of gamma tokens, a hierarchy
of models or a token tree; ``eval/drafts.py``), the generation length, batch
size and seed. :func:`run` decodes every (config, example) with
``decoding.generate`` (``generate_hierarchy`` for a hierarchy) and appends
ONE JSON line per pair to a results file, the moment it is measured:

    pair = default_models.load('t5_codegen')
    examples = default_models.examples('t5_codegen', limit=20)
    configs = grid({'target_only': {}, 'token_v3': {'alpha': [0.1, 0.3]}},
                   temperature=[0.0, 0.5])
    run(pair, configs, examples, 'out/results.jsonl')

Latency protocol (the paper's): wall-clock seconds of ``generate`` per call,
batch 1 by default, compilation excluded -- every distinct compiled program
(method structure, sampling kind, gamma, lengths, padded widths, batch) is run
once untimed before its first timed call (a hierarchy compiles per buffer
sizes, a tree per (nodes, depth, children) shape). Knob values (alpha, beta,
temperature, top-p, seeds) are traced, so a knob sweep of one method compiles
once. Every call pads its prompts (decoder-only) or encoder inputs to ONE
width for the whole example set (``generate(..., pad_to=width)``; t5x style),
so each method compiles once per pair whatever the examples' lengths, and no
example has to be left out for being long. Padding never changes outputs.

Resuming: each row is written with a single ``write`` and ``fsync``'d before
the next example starts. Rerunning the same sweep on the same file skips every
row whose key is already there; a torn last line (the process was killed while
writing it) is cut off on open. Only one process may write a results file at
a time (an exclusive ``flock``).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
import zlib
from typing import Callable, Iterable, Mapping, Protocol, Sequence

import numpy as np

from specdec_jax import decoding
from specdec_jax.decoding import api as decoding_api
from specdec_jax.decoding import inputs as decoding_inputs
from specdec_jax.decoding import registry
from specdec_jax.eval import drafts
# The results file (re-exported: ``harness.ResultsFile``, ``load_rows``).
from specdec_jax.eval.results_file import ResultsFile, load_rows  # pylint: disable=unused-import

# Methods whose output and cost do not depend on gamma (no draft block);
# their configs store gamma=0 so a gamma sweep runs them once.
NO_GAMMA = frozenset(e.name for e in registry.ENTRIES if not e.needs_gamma)


def is_greedy_only(method: str) -> bool:
  """True for methods that only run at temperature 0 (BiLD, LossyGreedy)."""
  return registry.get(method).greedy_only


def _canonical_knob(method: str, name: str, value):
  """float for numeric knobs (int where the method's default is an int, e.g.

  TokenCascade's chunk), strings (static options such as ``loss='log'``)
  unchanged, so equal settings always give equal keys.
  """
  if isinstance(value, str):
    return value
  if isinstance(value, bool) or not isinstance(value, (int, float,
                                                       np.number)):
    raise ValueError(f"knob {name!r} of {method} must be a number or a "
                     f"string, got {value!r}; sweep knobs by listing one "
                     f"config per value")
  default = registry.get(method).defaults.get(name)
  if isinstance(default, int) and not isinstance(default, bool):
    if not float(value).is_integer():
      raise ValueError(f"knob {name!r} of {method} must be an integer, got "
                       f"{value!r}")
    return int(value)
  return float(value)


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """One configuration of a sweep (hashable; the JSONL key derives from it).

  Attributes:
    method: a name in ``decoding.METHODS``.
    knobs: the method's knobs as sorted ``(name, value)`` pairs; a dict is
      accepted and normalised (``RunConfig('opt', {'alpha': 0.5})``).
      Numbers become floats (ints for integer knobs such as TokenCascade's
      ``chunk``); strings (``loss='log'``) stay strings.
    temperature: >= 0; 0 is greedy (top_p is then ignored and stored as 1).
    top_p: nucleus mass in (0, 1]; 1 disables truncation.
    gamma: draft block size (>= 1); 0 for methods without drafts (NO_GAMMA).
    max_new_tokens: tokens to generate at most; None uses the pair's default.
    batch_size: examples per ``generate`` call (the paper's protocol is 1).
    seed: sampling seed; each example's request id is a hash of its id, so
      results do not depend on the order or batching of examples.
    hierarchy: buffer sizes (T_0, ..., T_{K-1}) of hierarchical speculative
      decoding over the pair's K + 1 levels (``pair.levels()``), ``method``
      verifying at the top (a speculative method); () = no hierarchy.
    tree: a tree spec ('kary:2,3', 'chain:5', optional '/iid' or '/top_k';
      ``drafts.py``): draft and verify a token tree per block; '' = none.
      With a hierarchy or a tree, gamma does not apply and is stored as 0;
      methods without a draft block (NO_GAMMA) ignore both, like gamma.
  """

  method: str
  knobs: tuple[tuple[str, float | int | str], ...] | Mapping = ()
  temperature: float = 0.0
  top_p: float = 1.0
  gamma: int = 5
  max_new_tokens: int | None = None
  batch_size: int = 1
  seed: int = 0
  hierarchy: tuple[int, ...] = ()
  tree: str = ""

  def __post_init__(self):
    if self.method not in decoding.METHODS:
      raise ValueError(f"unknown method {self.method!r}; choose one of "
                       f"{', '.join(sorted(decoding.METHODS))}")
    knobs = tuple(sorted((k, _canonical_knob(self.method, k, v))
                         for k, v in dict(self.knobs).items()))
    set_ = lambda name, value: object.__setattr__(self, name, value)
    set_("knobs", knobs)
    t, p = float(self.temperature), float(self.top_p)
    if not math.isfinite(t) or t < 0:
      raise ValueError(f"temperature must be a finite number >= 0, got {t}")
    if not 0 < p <= 1:
      raise ValueError(f"top_p must be in (0, 1], got {p}")
    set_("temperature", t)
    set_("top_p", 1.0 if t == 0 else p)
    hierarchy = drafts.canonical_hierarchy(self.hierarchy)
    tree = drafts.canonical_tree(self.tree)
    if self.method in NO_GAMMA:
      hierarchy, tree = (), ""
    drafts.check(self.method, hierarchy, tree)
    set_("hierarchy", hierarchy)
    set_("tree", tree)
    fixed = self.method in NO_GAMMA or self.draft
    gamma = 0 if fixed else self.gamma
    if not fixed and (not isinstance(gamma, (int, np.integer)) or gamma < 1):
      raise ValueError(f"gamma must be an integer >= 1 for {self.method}, "
                       f"got {gamma!r}")
    set_("gamma", int(gamma))
    if self.max_new_tokens is not None and self.max_new_tokens < 0:
      raise ValueError(f"max_new_tokens must be >= 0, got "
                       f"{self.max_new_tokens}")
    if self.batch_size < 1:
      raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
    self.make_method()  # unknown knobs / out-of-range values fail here
    if t > 0 and is_greedy_only(self.method):
      raise ValueError(f"{self.method} is greedy-only; use temperature 0")

  def make_method(self):
    """The decoding method object with this config's knobs."""
    method = decoding.make_method(self.method, **dict(self.knobs))
    method.validate()
    return method

  def sampling(self):
    """Greedy() at temperature 0, else Temperature(t) or TopP(p, t)."""
    if self.temperature == 0:
      return decoding.Greedy()
    if self.top_p == 1.0:
      return decoding.Temperature(self.temperature)
    return decoding.TopP(p=self.top_p, temperature=self.temperature)

  @property
  def knob_str(self) -> str:
    """'alpha=0.3' (comma-separated knobs; '' without knobs)."""
    return ",".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in self.knobs)

  @property
  def draft(self) -> str:
    """The draft structure beside the chain: 'hierarchy=3,6', 'tree=kary:2,3'
    or '' (the chain of gamma)."""
    if self.hierarchy:
      return "hierarchy=" + ",".join(map(str, self.hierarchy))
    return f"tree={self.tree}" if self.tree else ""

  @property
  def label(self) -> str:
    """Readable method name: 'SpecDecode', 'SpecDecode tree 2x3',
    'HSD small>medium>large (3,6)' (``drafts.label``)."""
    return drafts.label(self.method, self.hierarchy, self.tree)

  @property
  def key(self) -> str:
    """Canonical text key, e.g. 'token_v3[alpha=0.3]|T=0|top_p=1|gamma=5|...'.

    Floats are written with ``repr`` so distinct values never collide. A
    hierarchy or a tree adds '|hierarchy=3,6' or '|tree=kary:2,3' at the
    end; chain configs keep the keys they had before those existed.
    """
    knobs = ",".join(f"{k}={v!r}" for k, v in self.knobs)
    draft = f"|{self.draft}" if self.draft else ""
    return (f"{self.method}[{knobs}]|T={self.temperature!r}|top_p="
            f"{self.top_p!r}|gamma={self.gamma}|max_new={self.max_new_tokens}"
            f"|bs={self.batch_size}|seed={self.seed}{draft}")

  def to_json(self) -> dict:
    """The fields as JSON; hierarchy / tree only when set (so chain rows
    read as before)."""
    d = dataclasses.asdict(self)
    d["knobs"] = dict(self.knobs)
    if self.hierarchy:
      d["hierarchy"] = list(self.hierarchy)
    else:
      del d["hierarchy"]
    if not self.tree:
      del d["tree"]
    return d

  @classmethod
  def from_json(cls, d: Mapping) -> "RunConfig":
    return cls(**d)


def _as_list(x) -> list:
  return list(x) if isinstance(x, (list, tuple)) else [x]


def grid(methods: Mapping[str, Mapping[str, Sequence[float]]] | Sequence[str],
         temperature=(0.0,), top_p=(1.0,), gamma=(5,),
         max_new_tokens: int | None = None, batch_size: int = 1,
         seed: int = 0, drafts: Sequence[Mapping] = ({},)
         ) -> list[RunConfig]:
  """The cartesian product of a sweep, deduplicated, in a stable order.

  Args:
    methods: method names, or ``{name: {knob: [values]}}`` (each method's
      knob lists are crossed with each other).
    temperature, top_p, gamma: a value or a list of values each.
    max_new_tokens, batch_size, seed: fixed for the sweep.
    drafts: draft structures, each a dict of RunConfig fields: ``{}`` (the
      chain of gamma), ``{'hierarchy': (3, 6)}`` or ``{'tree': 'kary:2,3'}``.

  Returns:
    RunConfigs. Greedy-only methods (bild, lossy_greedy) appear only at
    temperature 0; top-p is dropped at temperature 0; gamma is dropped for
    methods without drafts (NO_GAMMA) and for hierarchies and trees; a
    method that cannot run a structure (BiLD on a tree) is left out of it,
    so no setting runs twice.
  """
  if not isinstance(methods, Mapping):
    methods = {m: {} for m in _as_list(methods)}
  structures = [_draft_fields(d) for d in drafts]
  out, seen = [], set()
  for name, knob_grid in methods.items():
    names = sorted(knob_grid)
    values = [_as_list(knob_grid[k]) for k in names]
    for draft, t, p, g in itertools.product(
        structures, _as_list(temperature), _as_list(top_p), _as_list(gamma)):
      if t > 0 and is_greedy_only(name) or not _runs_on(name, draft):
        continue
      for combo in itertools.product(*values):
        cfg = RunConfig(name, dict(zip(names, combo)), temperature=t,
                        top_p=p, gamma=g, max_new_tokens=max_new_tokens,
                        batch_size=batch_size, seed=seed, **draft)
        if cfg not in seen:
          seen.add(cfg)
          out.append(cfg)
  return out


def _draft_fields(d: Mapping) -> dict:
  """A ``grid(drafts=...)`` entry, checked: {'hierarchy': ..., 'tree': ...}."""
  if not isinstance(d, Mapping) or set(d) - {"hierarchy", "tree"}:
    raise ValueError(f"each draft structure is a dict with 'hierarchy' "
                     f"and/or 'tree', e.g. {{'tree': 'kary:2,3'}}; got {d!r}")
  return dict(d)


def _runs_on(method: str, draft: Mapping) -> bool:
  """Whether ``method`` can decode with this draft structure (methods
  without a draft block run with any: it is dropped)."""
  return method in NO_GAMMA or drafts.supports(
      method, drafts.canonical_hierarchy(draft.get("hierarchy", ())),
      drafts.canonical_tree(draft.get("tree", "")))


class Pair(Protocol):
  """What :func:`run` needs of a model pair (``default_models.DefaultPair``).

  A pair may also have ``levels() -> [(model, params)]`` (cheapest first)
  for hierarchies of more than two levels (``drafts.pair_levels``).
  """

  name: str
  drafter: object
  verifier: object
  q_params: object
  p_params: object
  max_new_tokens: int
  metrics: tuple[str, ...]  # metric names, the primary first (report.py)

  def encode(self, examples: Sequence[Mapping]) -> dict: ...

  def decode(self, token_rows: Sequence[Sequence[int]]) -> list[str]: ...


def request_id(example_id: str) -> int:
  """A stable int32 request id of an example id (CRC-32, top bit cleared)."""
  return zlib.crc32(str(example_id).encode("utf-8")) & 0x7FFFFFFF


def row_key(pair_name: str, config: RunConfig, example_id: str) -> str:
  """The JSONL key of one (pair, config, example)."""
  return f"{pair_name}|{config.key}|{example_id}"


# ---------------------------------------------------------------- running


@dataclasses.dataclass
class RunStats:
  """What one :func:`run` call did.

  Attributes:
    written: rows measured and appended.
    skipped: rows already in the file.
    warmups: distinct programs compiled (one untimed call each).
    warmup_s: seconds spent in those untimed calls (mostly compilation).
    decode_s: seconds of timed decoding (all repeats).
    wall_s: seconds of the whole call.
    cpu_s: CPU seconds of this process during the call (on a machine
      shared with other work, closer to the time an idle machine takes).
    pad_width: the padded width of every call's prompts / encoder inputs
      (:func:`encode_examples`; 0 without examples).
  """

  written: int = 0
  skipped: int = 0
  warmups: int = 0
  warmup_s: float = 0.0
  decode_s: float = 0.0
  wall_s: float = 0.0
  cpu_s: float = 0.0
  pad_width: int = 0


def padded_width(rows) -> int:
  """The width ``generate`` pads these token rows to (a multiple of 16)."""
  width = max(1, max(len(r) for r in rows))
  return -(-width // decoding_api.PAD_TO) * decoding_api.PAD_TO


def encode_examples(pair: Pair, examples: Sequence[Mapping]
                    ) -> tuple[list[dict], int]:
  """Per-example ``generate`` kwargs and the example set's padded width.

  Returns:
    (one ``{'inputs': [ids]}`` or ``{'prompts': [ids]}`` dict per example,
    ragged; the longest row of ``examples`` rounded up to a multiple of 16).
    Every ``generate`` call of a sweep passes ``pad_to=width``, so all
    examples of an encoder-decoder or a decoder-only pair share one compiled
    program per method; rows keep their own lengths (``generate`` pads
    prompts on the right and tracks per-row lengths; the encoder masks padded
    inputs), so the width never changes an output.
  """
  kwargs = pair.encode(list(examples))
  if set(kwargs) - {"inputs", "prompts"} or not kwargs:
    raise ValueError(f"{pair.name}.encode must return 'inputs' and/or "
                     f"'prompts', got {sorted(kwargs)}")
  per = [dict() for _ in examples]
  width = 0
  for name, rows in kwargs.items():
    rows = [list(map(int, r)) for r in rows]
    if len(rows) != len(examples):
      raise ValueError(f"{pair.name}.encode returned {len(rows)} {name} for "
                       f"{len(examples)} examples")
    if rows:
      width = max(width, padded_width(rows))
    for d, r in zip(per, rows):
      d[name] = r
  return per, width


def _batches(todo, size):
  for i in range(0, len(todo), size):
    yield todo[i:i + size]


def _program(pair: Pair, cfg: RunConfig, batch: int, max_new: int,
             width: int):
  """What decides the compiled program (knob and seed values do not): the
  method's static rule (its registry name and static options), the sampling
  class (Greedy runs as Temperature(0)) and the shapes."""
  static = tuple((k, v) for k, v in cfg.knobs if isinstance(v, str))
  return (pair.name, cfg.method, static,
          decoding_inputs.sampling_static(cfg.sampling()),
          drafts.program_key(cfg.hierarchy, cfg.tree, cfg.gamma), max_new,
          batch, width)


def _timed(fn: Callable, call: dict, repeats: int, clock):
  """(DecodeResult, [seconds of each of ``repeats`` ``fn(**call)`` calls])."""
  runs = []
  for _ in range(repeats):
    t0 = clock()
    res = fn(**call)
    runs.append(clock() - t0)
  return res, runs


def _rows(pair: Pair, cfg: RunConfig, ex_ids: Sequence[str], res,
          runs: Sequence[float], max_new: int) -> list[dict]:
  """The JSONL rows of one timed batch (the fastest run is the latency)."""
  seqs = res.sequences()
  texts = pair.decode(seqs)
  elapsed = min(runs)
  rows = []
  for j, ex_id in enumerate(ex_ids):
    row = dict(
        key=row_key(pair.name, cfg, ex_id), pair=pair.name,
        config_key=cfg.key, config=cfg.to_json(), example_id=ex_id,
        prediction=texts[j], tokens=seqs[j], num_tokens=len(seqs[j]),
        latency_s=elapsed / len(ex_ids), batch_latency_s=elapsed,
        batch=len(ex_ids), verifier_calls=int(res.verifier_calls[j]),
        drafter_calls=int(res.drafter_calls[j]),
        accepted=int(res.accepted[j]), drafted=int(res.drafted[j]),
        deferrals=float(res.deferrals[j]), max_new_tokens=max_new)
    if res.level_rejected is not None:  # verification rounds ending in a
      row["rejected"] = int(res.level_rejected[j, -1])  # rejection (top)
    if len(runs) > 1:
      row["batch_latency_runs_s"] = list(runs)
    if cfg.hierarchy:  # [K + 1] per level, cheapest first
      row.update(level_calls=res.calls[j].tolist(),
                 level_drafted=res.level_drafted[j].tolist(),
                 level_accepted=res.level_accepted[j].tolist())
    rows.append(row)
  return rows


def run(pair: Pair, configs: Iterable[RunConfig],
        examples: Sequence[Mapping], path: str, *, progress: bool = True,
        warmup: bool = True, repeats: int = 1, sync: bool = True,
        on_row: Callable[[dict], None] | None = None,
        clock: Callable[[], float] = time.perf_counter) -> RunStats:
  """Decodes every (config, example) not yet in ``path`` and appends rows.

  Args:
    pair: the model pair (name, drafter, verifier, q_params, p_params,
      max_new_tokens, encode, decode; ``levels()`` for hierarchies of more
      than two levels).
    configs: RunConfigs (e.g. from :func:`grid`).
    examples: dicts with 'id' and 'inputs' (and 'targets' for scoring).
    path: the JSONL results file (created; resumed if it exists).
    progress: show a tqdm progress bar.
    warmup: run each distinct program once untimed before timing it.
    repeats: time each call this many times and keep the fastest (a robust
      latency on a busy machine; the outputs are identical every time).
    sync: fsync after every row (turn off only for throwaway files).
    on_row: called with each new row after it is written.
    clock: the timer (seconds).

  Returns:
    RunStats.

  Raises:
    ValueError: before anything is decoded, for a hierarchy config the pair
      has not the levels for (``drafts.unsupported``; leave it out).
  """
  if repeats < 1:
    raise ValueError(f"repeats must be >= 1, got {repeats}")
  configs = list(configs)
  for cfg in configs:
    why = drafts.unsupported(pair, cfg.hierarchy)
    if why:
      raise ValueError(f"config {cfg.key} cannot run: {why}")
  ids = [str(ex["id"]) for ex in examples]
  if len(set(ids)) != len(ids):
    raise ValueError("example ids must be unique")
  start, cpu_start = clock(), time.process_time()
  stats = RunStats()
  # One width for the whole example set (not just the rows still to do), so
  # a resumed sweep runs the same programs as an uninterrupted one.
  encoded, width = encode_examples(pair, examples) if ids else ([], 0)
  stats.pad_width = width
  with ResultsFile(path, sync=sync) as results:
    todo_all = []
    for cfg in configs:
      todo = [i for i, ex_id in enumerate(ids)
              if row_key(pair.name, cfg, ex_id) not in results.keys]
      stats.skipped += len(ids) - len(todo)
      if todo:
        todo_all.append((cfg, todo))
    total = sum(len(t) for _, t in todo_all)
    bar = _progress(total, f"{pair.name}", progress)
    warm = set()
    try:
      for cfg, todo in todo_all:
        method = cfg.make_method()
        max_new = (pair.max_new_tokens if cfg.max_new_tokens is None
                   else cfg.max_new_tokens)
        bar.set_postfix_str(f"{cfg.method} {cfg.knob_str}".strip())
        for chunk in _batches(todo, cfg.batch_size):
          kwargs = {k: [encoded[i][k] for i in chunk] for k in encoded[0]}
          fn, call = drafts.decode_call(
              pair, method, cfg.hierarchy, cfg.tree, cfg.gamma,
              sampling=cfg.sampling(), max_new_tokens=max_new,
              seeds=cfg.seed, request_ids=[request_id(ids[i]) for i in chunk],
              pad_to=width, **kwargs)
          prog = _program(pair, cfg, len(chunk), max_new, width)
          if warmup and prog not in warm:
            stats.warmup_s += _timed(fn, call, 1, clock)[1][0]
            stats.warmups += 1
            warm.add(prog)
          res, runs = _timed(fn, call, repeats, clock)
          stats.decode_s += sum(runs)
          for row in _rows(pair, cfg, [ids[i] for i in chunk], res, runs,
                           max_new):
            results.append(row)
            stats.written += 1
            if on_row is not None:
              on_row(row)
          bar.update(len(chunk))
    finally:
      bar.close()
  stats.wall_s = clock() - start
  stats.cpu_s = time.process_time() - cpu_start
  return stats


class _NoBar:

  def update(self, n):
    del n

  def set_postfix_str(self, s):
    del s

  def close(self):
    pass


def _progress(total: int, desc: str, enabled: bool):
  if not enabled or not total:
    return _NoBar()
  try:
    from tqdm.auto import tqdm  # pylint: disable=g-import-not-at-top
  except ImportError:
    return _NoBar()
  return tqdm(total=total, desc=desc, unit="row", dynamic_ncols=True)
