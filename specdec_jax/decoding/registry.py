"""The ONE table of decoding methods.

Every place that lists methods reads it: ``make_method`` and its validation,
the gin ``method_spec`` of the CLI and the shipped ``gin/methods/*.gin``
files (a test checks they match), the evaluation harness (which methods take
gamma, which are greedy-only), the sweep configs and the main job's default
grids, and the plots' legend labels. Adding a method is its rule (a target
in ``rules/`` or a loop in ``loops/``) plus one row here.

    row = registry.get("token_v3")
    row.label            # 'SpecCascade [TokenV3]'
    row.knobs            # ('alpha',)
    row.grid             # {'alpha': (0.1, 0.3, 0.5, 0.7, 0.9)}: paper sweep
    row.make(alpha=0.3)  # Speculative(TokenV3(alpha=0.3))
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, Mapping

from specdec_jax.decoding import methods as m
from specdec_jax.decoding.rules import cascades as c
from specdec_jax.decoding.rules import targets as t


@dataclasses.dataclass(frozen=True)
class Entry:
  """One decoding method.

  Attributes:
    name: the method's name (gin, CLI, result files).
    label: paper-style name for tables and plot legends.
    make: knobs as keywords -> a method object.
    kind: 'baseline', 'speculative' (lossless or lossy speculative
      sampling), 'cascade' (a speculative cascade) or 'sequential' (a
      non-speculative cascade baseline).
    needs_gamma: whether the method drafts blocks (its cost depends on the
      draft topology); False methods run once in a gamma sweep.
    trees: whether it runs on draft trees (tree verification).
    grid: the paper-style sweep of each knob (configs/sweeps.py); None:
      not in the paper sweeps ({}: in them, without knobs).
    main_grid: the small sweep of the built-in main job (None: not in it).
  """

  name: str
  label: str
  make: Callable[..., Any]
  kind: str
  needs_gamma: bool = True
  trees: bool = True
  grid: Mapping[str, tuple] | None = None
  main_grid: Mapping[str, tuple] | None = None

  @property
  def knobs(self) -> tuple[str, ...]:
    """Names of the method's knobs (its ``make`` keywords)."""
    return tuple(inspect.signature(self.make).parameters)

  @property
  def defaults(self) -> dict[str, Any]:
    return {k: p.default for k, p in
            inspect.signature(self.make).parameters.items()}

  def method(self, **knobs):
    return self.make(**knobs)

  @property
  def greedy_only(self) -> bool:
    return bool(self.make().greedy_only)

  @property
  def uses_drafter(self) -> bool:
    return bool(self.make().uses_drafter)


# Static fields that are facts of a rule class, not options a user sets.
_CLASS_FACTS = ("needs_drafter_at_bonus", "normalized")


def _wrap(build, target_cls, **fixed):
  """A ``make`` for build(target_cls(**fixed, **knobs)) whose signature
  lists the target's knobs: its traced fields (alpha, beta) and its static
  options (loss, tuned, divergence) that ``fixed`` does not set."""
  knobs = [f for f in dataclasses.fields(target_cls)
           if f.name not in fixed and f.name not in _CLASS_FACTS]

  def make(**kw):
    return build(target_cls(**fixed, **kw))

  make.__signature__ = inspect.Signature([
      inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY,
                        default=f.default) for f in knobs])
  return make


def _spec(target_cls, **fixed):
  return _wrap(m.Speculative, target_cls, **fixed)


def _oracle(target_cls):
  return _wrap(m.OracleCascade, target_cls)


_A5 = (0.1, 0.3, 0.5, 0.7, 0.9)
_TOKEN = (0.0, 0.1, 0.2, 0.4, 0.6)

ENTRIES: tuple[Entry, ...] = (
    Entry("target_only", "Target only (large)", m.TargetOnly, "baseline",
          needs_gamma=False, trees=False, grid={}, main_grid={}),
    Entry("drafter_only", "Drafter only (small)", m.DrafterOnly, "baseline",
          needs_gamma=False, trees=False, grid={}, main_grid={}),
    Entry("spec_decode", "SpecDecode", _spec(t.SpecDecode), "speculative",
          grid={}, main_grid={}),
    Entry("lossy", "SpecDecode [Lossy, beta=1]", _spec(t.Lossy),
          "speculative", grid={"alpha": _A5, "beta": (1.0,)},
          main_grid={"alpha": (0.2, 0.5, 0.8)}),
    Entry("lossy_tuned", "SpecDecode [Lossy, tuned beta]",
          _spec(t.Lossy, tuned=True), "speculative", grid={"alpha": _A5},
          main_grid={"alpha": (0.2, 0.5, 0.8)}),
    Entry("lossy_greedy", "SpecDecode [Lossy, Greedy]",
          _spec(t.LossyGreedy), "speculative"),
    Entry("chow", "SpecCascade [Chow]", _spec(c.Chow), "cascade",
          grid={"alpha": _A5}, main_grid={"alpha": (0.1, 0.3, 0.6)}),
    Entry("diff", "SpecCascade [Diff]", _spec(c.Diff), "cascade",
          grid={"alpha": (-0.2, 0.0, 0.1, 0.2, 0.4)},
          main_grid={"alpha": (0.0, 0.2, 0.4)}),
    Entry("opt", "SpecCascade [OPT]", _spec(c.OPT), "cascade",
          grid={"alpha": (0.0, 0.2, 0.5, 1.0, 2.0)},
          main_grid={"alpha": (0.0, 1.0, 3.0)}),
    Entry("chow_log", "SpecCascade [Chow, log]", _spec(c.Chow, loss="log"),
          "cascade"),
    Entry("diff_log", "SpecCascade [Diff, log]", _spec(c.Diff, loss="log"),
          "cascade"),
    Entry("opt_log", "SpecCascade [OPT, log]", _spec(c.OPT, loss="log"),
          "cascade"),
    Entry("token_v1", "SpecCascade [TokenV1]", _spec(c.TokenV1), "cascade",
          grid={"alpha": _TOKEN}, main_grid={"alpha": (0.0, 0.2, 0.4)}),
    Entry("token_v2", "SpecCascade [TokenV2]", _spec(c.TokenV2), "cascade",
          grid={"alpha": _TOKEN}, main_grid={"alpha": (0.0, 0.2, 0.4)}),
    Entry("token_v3", "SpecCascade [TokenV3]", _spec(c.TokenV3), "cascade",
          grid={"alpha": _A5}, main_grid={"alpha": (0.2, 0.5, 0.8)}),
    Entry("bild_star", "BiLD*", _spec(c.BiLDStar), "cascade",
          grid={"alpha": (0.1, 0.2, 0.3, 0.5, 0.7)},
          main_grid={"alpha": (0.2, 0.4, 0.7)}),
    Entry("bild", "BiLD", m.BiLD, "cascade", trees=False,
          grid={"alpha_fallback": (0.3, 0.5, 0.7, 0.9),
                "alpha_rollback": (2.0,)},
          main_grid={"alpha_rollback": (0.5, 1.5, 4.0)}),
    Entry("token_cascade", "TokenCascade [Chow]", m.TokenCascade,
          "sequential", needs_gamma=False, trees=False, grid={"alpha": _A5},
          main_grid={"alpha": (0.1, 0.3, 0.6)}),
    Entry("oracle_diff", "OracleCascade [Diff]", _oracle(c.Diff),
          "sequential", needs_gamma=False, trees=False),
    Entry("oracle_opt", "OracleCascade [OPT]", _oracle(c.OPT), "sequential",
          needs_gamma=False, trees=False),
    Entry("seq_cascade", "SeqCascade [Chow]", m.SeqCascade, "sequential",
          needs_gamma=False, trees=False, grid={"alpha": _A5},
          main_grid={"alpha": (0.9, 0.99, 0.9999)}),
)

REGISTRY: dict[str, Entry] = {e.name: e for e in ENTRIES}
# name -> constructor taking the method's knobs as keywords.
METHODS: dict[str, Callable[..., Any]] = {e.name: e.make for e in ENTRIES}
KNOB_NAMES: tuple[str, ...] = tuple(sorted({k for e in ENTRIES
                                            for k in e.knobs}))


def get(name: str) -> Entry:
  """The registry row of ``name``; ValueError listing the names if unknown."""
  if name not in REGISTRY:
    raise ValueError(f"unknown method {name!r}; choose one of "
                     f"{', '.join(sorted(REGISTRY))}")
  return REGISTRY[name]


def make_method(name: str, **knobs):
  """A method by name, e.g. ``make_method('opt', alpha=0.2)``.

  Args:
    name: one of :data:`METHODS`.
    **knobs: the method's knobs (alpha, beta, alpha_fallback, ...).

  Raises:
    ValueError for an unknown name or knob.
  """
  entry = get(name)
  bad = sorted(set(knobs) - set(entry.knobs))
  if bad:
    raise ValueError(f"bad knobs {sorted(knobs)} for method {name!r}: "
                     f"unknown {bad}; its knobs are {list(entry.knobs)}")
  return entry.make(**knobs)
