"""Hierarchies on the command line: which models stack under the verifier.

A hierarchy for ``specdec_jax decode`` (``run.hierarchy = @hierarchy_spec()``,
gin/hierarchies/*.gin) and the candidates of ``specdec_jax plan-hierarchy``
are written as LEVELS, each either

* a ``ModelSpec`` (a preset, a checkpoint, or a built-in default model:
  ``default_pair`` with ``role`` 'drafter', 'medium' or 'verifier'), or
* ``'exit:K'``: the verifier's first K decoder layers, then its final norm
  and LM head (``models.early_exit``; it reads the verifier's parameters,
  nothing is loaded twice).

The verifier (the run's VERIFIER) is always the top level. Everything here
checks a hierarchy from the models' configs before any weights are read,
loads its levels, and writes a hierarchy as a gin file (the output of
plan-hierarchy). Gin-free: ``main.py`` binds it.
"""

from __future__ import annotations

import dataclasses
import re
import textwrap
from typing import Any, Sequence

import numpy as np

from specdec_jax import decoding, models
from specdec_jax import tokenizer as tokenizer_lib
from specdec_jax.decoding import request
from specdec_jax.model_spec import ModelSpec

EXIT_PATTERN = re.compile(r"exit:(\d+)")
LEVEL_HELP = ("a level is a ModelSpec (gin: @scope/ModelSpec()) or 'exit:K' "
              "(the verifier's first K decoder layers)")


@dataclasses.dataclass(frozen=True)
class EarlyExit:
  """The verifier truncated after ``layers`` decoder layers.

  Attributes:
    layers: decoder layers run, 1 .. (verifier's layers - 1).
  """

  layers: int

  def __str__(self) -> str:
    return f"exit:{self.layers}"


def parse_level(x: Any, what: str = "level"):
  """A level as a ModelSpec or an EarlyExit; ValueError for anything else.

  Args:
    x: a ``ModelSpec``, an ``EarlyExit`` or the string 'exit:K'.
    what: how to name it in errors ("hierarchy level 1", "candidate 'x'").
  """
  if isinstance(x, (ModelSpec, EarlyExit)):
    return x
  if isinstance(x, str):
    m = EXIT_PATTERN.fullmatch(x.strip())
    if m and int(m.group(1)) >= 1:
      return EarlyExit(int(m.group(1)))
  raise ValueError(f"unknown {what} {x!r}: {LEVEL_HELP}, e.g. 'exit:1'")


def level_name(level) -> str:
  """A short printable name of a level."""
  if isinstance(level, EarlyExit):
    return str(level)
  if level.default_pair:
    return f"{level.default_pair}/{level.role}"
  if level.checkpoint:
    return str(level.checkpoint).rstrip("/").rsplit("/", 1)[-1]
  return f"{level.preset}" + (f"@seed{level.seed}" if level.seed else "")


def architecture(level, verifier_model, what: str):
  """The model object of a level from configs only (no weights read).

  Raises:
    ValueError: the level does not fit under the verifier (vocabulary,
      family, early exit deeper than the verifier).
  """
  if isinstance(level, EarlyExit):
    n = verifier_model.num_decoder_layers
    if level.layers >= n:
      raise ValueError(
          f"{what} is an early exit after {level.layers} decoder layers but "
          f"the verifier has {n}; use 'exit:1' .. 'exit:{n - 1}' (exit:{n} "
          f"would be the verifier itself)")
    return models.early_exit(verifier_model, level.layers)
  model = level.architecture(verifier_model)
  if model.vocab_size != verifier_model.vocab_size:
    raise ValueError(f"{what} ({level_name(level)}) has a vocabulary of "
                     f"{model.vocab_size} ids but the verifier has "
                     f"{verifier_model.vocab_size}: every level must share "
                     f"the tokenizer")
  if model.is_encoder_decoder != verifier_model.is_encoder_decoder:
    raise ValueError(f"{what} ({level_name(level)}) and the verifier must "
                     f"both be encoder-decoder (T5) or both decoder-only "
                     f"(Gemma)")
  return model


def check_tokenizer(level, model, verifier_tok, what: str) -> None:
  """A ModelSpec level's tokenizer must be the verifier's (when both have
  one)."""
  if isinstance(level, EarlyExit) or verifier_tok is None:
    return
  tok = level.load_tokenizer(model)
  if tok is not None:
    try:
      tokenizer_lib.check_same_vocabulary(tok, verifier_tok)
    except ValueError as e:
      raise ValueError(f"{what} ({level_name(level)}): {e}") from None


@dataclasses.dataclass(frozen=True)
class HierarchySpec:
  """A hierarchy under the run's verifier (``structure_specs.hierarchy_spec``).

  Attributes:
    drafters: levels 0 .. K-1, cheapest first (each a ``ModelSpec``
      or an ``EarlyExit``; strings 'exit:K' are parsed).
    buffers: (T_0, ..., T_{K-1}): level 0 drafts T_0 tokens per batch,
      level n accumulates verified tokens until it holds >= T_n.
    lenient: ((n, method), ...) intermediate levels 1..K-1 that verify with
      a speculative cascade (the top must then be spec_decode).
  """

  drafters: tuple
  buffers: tuple[int, ...]
  lenient: tuple = ()

  def __post_init__(self):
    if isinstance(self.drafters, (str, bytes)) or not isinstance(
        self.drafters, Sequence) or not self.drafters:
      raise ValueError(f"a hierarchy needs at least one drafter level under "
                       f"the verifier (hierarchy_spec.drafters = [...]), got "
                       f"{self.drafters!r}")
    drafters = tuple(parse_level(x, f"hierarchy level {i}")
                     for i, x in enumerate(self.drafters))
    object.__setattr__(self, "drafters", drafters)
    if isinstance(self.buffers, (str, bytes)) or not isinstance(
        self.buffers, Sequence):
      raise ValueError(f"hierarchy buffers must be a list of integers, got "
                       f"{self.buffers!r}")
    if len(self.buffers) != len(drafters):
      raise ValueError(f"{len(drafters)} drafter level(s) need "
                       f"{len(drafters)} buffer sizes (T_0 .. T_"
                       f"{len(drafters) - 1}), got {len(self.buffers)}: "
                       f"{list(self.buffers)}")
    for i, t in enumerate(self.buffers):
      if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 1:
        raise ValueError(f"hierarchy buffer T_{i} must be an integer >= 1, "
                         f"got {t!r}")
    object.__setattr__(self, "buffers", tuple(int(t) for t in self.buffers))
    lenient = dict(self.lenient or ())
    object.__setattr__(self, "lenient", tuple(sorted(lenient.items(),
                                                     key=lambda kv: kv[0])))

  @property
  def depth(self) -> int:
    """K: the verifier's level (number of drafter levels)."""
    return len(self.drafters)

  def slack(self) -> int:
    """Cache slots a hierarchy needs beyond prompt + budget."""
    return sum(self.buffers) + self.depth + 2

  def architectures(self, verifier_model, verifier_tok=None) -> list:
    """Model objects of the drafter levels, checked (no weights read)."""
    out = []
    for i, lv in enumerate(self.drafters):
      model = architecture(lv, verifier_model, f"hierarchy level {i}")
      check_tokenizer(lv, model, verifier_tok, f"hierarchy level {i}")
      out.append(model)
    return out

  def check(self, method, verifier_model, verifier_tok=None) -> list:
    """Everything that can be checked before loading; returns the drafter
    levels' model objects."""
    if not isinstance(method, decoding.Speculative):
      raise ValueError(f"a hierarchy's top level verifies with a speculative "
                       f"method (spec_decode, a lossy or cascade rule), got "
                       f"{type(method).__name__}")
    archs = self.architectures(verifier_model, verifier_tok)
    request.stack_shape(decoding.Stack((1,) * self.depth,
                                       lenient=dict(self.lenient)), method)
    return archs

  def load(self, verifier_model, p_params) -> list[tuple[Any, Any]]:
    """[(model, params)] of every level, the verifier last (early exits
    share the verifier's params; equal ModelSpecs load once)."""
    loaded: dict = {}
    levels = []
    for i, lv in enumerate(self.drafters):
      if isinstance(lv, EarlyExit):
        levels.append((architecture(lv, verifier_model,
                                    f"hierarchy level {i}"), p_params))
        continue
      if lv not in loaded:
        model, params, _ = lv.load(verifier_model)
        loaded[lv] = (model, params)
      levels.append(loaded[lv])
    return levels + [(verifier_model, p_params)]

  def describe(self) -> str:
    names = [level_name(lv) for lv in self.drafters] + ["verifier"]
    return f"{' -> '.join(names)}, buffers {list(self.buffers)}"


def _spec_lines(scope: str, spec) -> list[str]:
  """gin bindings that rebuild the ModelSpec ``spec`` under ``scope``."""
  defaults = ModelSpec()
  lines = []
  for f in dataclasses.fields(spec):
    value = getattr(spec, f.name)
    if value != getattr(defaults, f.name) or f.name == "role":
      lines.append(f"{scope}/ModelSpec.{f.name} = {value!r}")
  return lines


def hierarchy_gin(drafters: Sequence, buffers: Sequence[int],
                  note: str = "") -> str:
  """A gin file that makes decode runs use this hierarchy.

  Args:
    drafters: levels 0 .. K-1 (ModelSpec / EarlyExit / 'exit:K').
    buffers: T_0 .. T_{K-1}.
    note: comment lines for the header (e.g. the planner's prediction).
  """
  spec = HierarchySpec(tuple(drafters), tuple(buffers))
  names = " -> ".join([level_name(lv) for lv in spec.drafters] +
                      ["verifier"])
  lines = [f"# Hierarchy: {names}, buffers {list(spec.buffers)}."]
  for para in note.splitlines():
    lines += [f"# {ln}" for ln in textwrap.wrap(para, 76)] or ["#"]
  lines += [
      "#",
      "# Include after runs/decode.gin, a pair (its VERIFIER is the top "
      "level) and",
      "# optionally a method (the top level's rule; default spec_decode). "
      "GAMMA is",
      "# ignored: the buffers set the block sizes.",
      "#",
      "# REQUIRED: none.",
      "# Commonly overridden:",
      "#   HIERARCHY_BUFFERS   [T_0, ..., T_{K-1}]: level 0 drafts T_0 "
      "tokens per",
      "#                       batch; level n verifies batches until it "
      "holds >= T_n",
  ]
  refs = []
  for i, lv in enumerate(spec.drafters):
    if isinstance(lv, EarlyExit):
      refs.append(repr(str(lv)))
    else:
      lines += _spec_lines(f"hierarchy_level{i}", lv)
      refs.append(f"@hierarchy_level{i}/ModelSpec()")
  lines += [f"HIERARCHY_BUFFERS = {list(spec.buffers)}",
            f"hierarchy_spec.drafters = [{', '.join(refs)}]",
            "hierarchy_spec.buffers = %HIERARCHY_BUFFERS",
            "run.hierarchy = @hierarchy_spec()"]
  return "\n".join(lines) + "\n"


__all__ = ["EarlyExit", "HierarchySpec", "architecture", "hierarchy_gin",
           "level_name", "parse_level"]
