"""The built-in default model families, trained on CPython's stdlib.

Two small trained families ship with the package, three sizes each (small,
medium, large; the small and medium ones distilled from the large one), so
speculative decoding, speculative cascades and hierarchical (3-level)
speculative decoding can be tried on any machine with real numbers:

    't5_codegen'        T5 v1.1 family (encoder-decoder): signature +
                        docstring -> first body lines
    'gemma_completion'  Gemma 2 family (decoder-only): the same task as a
                        completion

Both score BLEU (the primary metric, used by the main job's summary) and
exact match of the whitespace-normalised code. ('t5_docstring', function
source -> first docstring sentence, scored by ROUGE-2, was the T5 family's
task before: its build stays reproducible, its models no longer ship.)

    from specdec_jax import decoding, families
    pair = families.load("t5_codegen")
    exs = families.examples("t5_codegen", "test", limit=8)
    out = decoding.generate(decoding.make_method("spec_decode"), pair.drafter,
                            pair.verifier, pair.q_params, pair.p_params,
                            **pair.encode(exs), gamma=5,
                            max_new_tokens=pair.max_new_tokens)
    pair.decode(out.sequences())
    pair.levels()  # [(small, params), (medium, params), (large, params)]

``pair.drafter`` / ``pair.q_params`` are the small model, ``pair.verifier`` /
``pair.p_params`` the large one and ``pair.medium`` / ``pair.m_params`` the
medium one. The data come from :mod:`specdec_jax.families.corpus`; the weights,
tokenizers and a metadata/report JSON live in
``specdec_jax/assets/default_models`` (directories ``drafter``, ``medium``,
``verifier`` per family) and are rebuilt by the default-model factory,
``python -m tools.default_models.build`` in a source checkout
(tools/default_models/README.md, docs/default_models.md).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import warnings
from typing import Sequence

from specdec_jax import tokenizer as tokenizer_lib
from specdec_jax.checkpoints import native
from specdec_jax.families import corpus as corpus_lib
from specdec_jax.models import families as model_families
from specdec_jax.models import model_from_config

PAIRS = ("t5_codegen", "gemma_completion")
# Names accepted by scripts/bench_decode.py --pair.
BENCHMARK_NAMES = {"default-t5": "t5_codegen",
                   "default-gemma": "gemma_completion"}
ASSETS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), "assets", "default_models")
METADATA = "metadata.json"
TOKENIZER = "tokenizer.model"
# Model sizes, cheapest first, and their asset directories.
LEVELS = ("small", "medium", "large")
LEVEL_DIRS = {"small": "drafter", "medium": "medium", "large": "verifier"}
BUILD_HINT = ("build them with `python -m tools.default_models.build` in a "
              "source checkout (tools/default_models/build.py, see "
              "docs/default_models.md), or install a specdec_jax package that "
              "includes specdec_jax/assets/default_models")


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """How a task's text becomes model tokens (shared by training and use).

  Attributes:
    name: task name (a key of :data:`TASKS`).
    family: 't5' (encoder-decoder) or 'gemma' (decoder-only).
    metrics: names in ``specdec_jax.eval.metrics.METRICS``.
    max_new_tokens: generation budget; covers every test target.
    max_input_tokens: T5: encoder ids (EOS included) are cut to this many;
      Gemma: prompts keep BOS and their last ``max_input_tokens - 1`` ids.
    max_target_tokens: training targets are cut to this many (EOS included).
    vocab_size: SentencePiece pieces (= model vocabulary, no extra ids).
  """

  name: str
  family: str
  metrics: tuple[str, ...]
  max_new_tokens: int
  max_input_tokens: int
  max_target_tokens: int
  vocab_size: int = 2048


TASKS = {
    "t5_docstring": TaskSpec("t5_docstring", "t5", ("rouge2",),
                             max_new_tokens=64, max_input_tokens=256,
                             max_target_tokens=64),
    "gemma_completion": TaskSpec("gemma_completion", "gemma",
                                 ("bleu", "code_exact_match"),
                                 max_new_tokens=64, max_input_tokens=320,
                                 max_target_tokens=64),
    # The shipped T5 family's task: the Gemma task's examples as
    # sequence-to-sequence (it replaced 't5_docstring', whose T5 sizes did
    # not order: benchmarks/results/default_models_progress.md).
    "t5_codegen": TaskSpec("t5_codegen", "t5", ("bleu", "code_exact_match"),
                           max_new_tokens=64, max_input_tokens=320,
                           max_target_tokens=64),
}

# SentencePiece options that keep source code intact: no normalisation, no
# whitespace collapsing, no dummy prefix; runs of spaces may be one piece.
SPM_OPTIONS = dict(normalization_rule_name="identity",
                   remove_extra_whitespaces=False, add_dummy_prefix=False,
                   allow_whitespace_only_pieces=True, split_digits=True,
                   num_threads=1)


def _check_name(name: str) -> str:
  name = BENCHMARK_NAMES.get(name, name)
  if name not in TASKS:
    raise ValueError(f"unknown default pair {name!r}; available: "
                     f"{', '.join(PAIRS)} (or for benchmarks "
                     f"{', '.join(BENCHMARK_NAMES)})")
  return name


def encode_inputs(tok: tokenizer_lib.Tokenizer, spec: TaskSpec,
                  text: str) -> list[int]:
  """Model input ids of one example's ``inputs`` text.

  Encoder-decoder families (T5; ``models/families.py``): the source ids +
  EOS, cut to ``max_input_tokens`` (EOS kept). Decoder-only (Gemma): BOS +
  prompt ids, keeping BOS and the last ``max_input_tokens - 1`` ids.
  """
  ids = tok.encode(text, add_bos=False)
  if model_families.get(spec.family).encoder_decoder:
    return ids[:spec.max_input_tokens - 1] + [tok.eos_id]
  return [tok.bos_id] + ids[-(spec.max_input_tokens - 1):]


def encode_targets(tok: tokenizer_lib.Tokenizer, spec: TaskSpec,
                   text: str) -> list[int]:
  """Target ids (no EOS; training appends it), cut to leave room for EOS."""
  return tok.encode(text, add_bos=False)[:spec.max_target_tokens - 1]


@dataclasses.dataclass
class DefaultPair:
  """A loaded default family (three sizes) and its tokenizer.

  Attributes:
    name: the task / family name.
    drafter, verifier: the small and the large model (q and p).
    q_params, p_params: their parameters.
    tokenizer: the shared Tokenizer.
    metrics: metric names for this task (``eval.metrics.METRICS`` keys).
    max_new_tokens: generation budget of the task.
    is_encoder_decoder: True for the T5 family.
    spec: the TaskSpec.
    info: this family's entry of the metadata JSON (sizes, quality, costs).
    medium, m_params: the medium model and its parameters (None in assets
      built before it existed).
  """

  name: str
  drafter: object
  verifier: object
  q_params: dict
  p_params: dict
  tokenizer: tokenizer_lib.Tokenizer
  metrics: tuple[str, ...]
  max_new_tokens: int
  is_encoder_decoder: bool
  spec: TaskSpec
  info: dict = dataclasses.field(default_factory=dict)
  medium: object | None = None
  m_params: dict | None = None

  def model(self, level: str) -> tuple[object, dict]:
    """(model, params) of 'small', 'medium' or 'large'."""
    if level not in LEVELS:
      raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    got = {"small": (self.drafter, self.q_params),
           "medium": (self.medium, self.m_params),
           "large": (self.verifier, self.p_params)}[level]
    if got[0] is None:
      raise ValueError(f"the {self.name!r} assets have no {level} model; "
                       f"{BUILD_HINT}")
    return got

  def levels(self) -> list[tuple[object, dict]]:
    """[(model, params)] small -> medium -> large (a 3-level stack for
    hierarchical speculative decoding; 2 levels without a medium model)."""
    return [self.model(lv) for lv in LEVELS
            if lv != "medium" or self.medium is not None]

  def encode(self, examples: Sequence[dict]) -> dict:
    """Keyword arguments of ``decoding.generate`` for ``examples``.

    Returns:
      ``{'inputs': [[ids]...]}`` (T5) or ``{'prompts': [[bos, ids]...]}``
      (Gemma), one ragged row per example.
    """
    rows = [encode_inputs(self.tokenizer, self.spec, e["inputs"])
            for e in examples]
    return {"inputs": rows} if self.is_encoder_decoder else {"prompts": rows}

  def decode(self, token_rows) -> list[str]:
    """Text of generated id rows, cut at the first EOS (pads dropped)."""
    return [self.tokenizer.decode(list(map(int, r))) for r in token_rows]

  def generate(self, method, examples: Sequence[dict], *,
               drafter: str = "small", verifier: str = "large", **kwargs):
    """``decoding.generate`` on ``examples``: (texts, DecodeResult).

    Args:
      method: a decoding method object (``decoding.make_method(...)``).
      examples: dicts with an 'inputs' string.
      drafter, verifier: which sizes play q and p ('small', 'medium',
        'large'); target-only runs the verifier, drafter-only the drafter.
      **kwargs: more ``generate`` arguments (sampling, gamma, seeds, ...);
        ``max_new_tokens`` defaults to the task's.
    """
    from specdec_jax import decoding  # pylint: disable=g-import-not-at-top
    kwargs.setdefault("max_new_tokens", self.max_new_tokens)
    (q, qp), (p, pp) = self.model(drafter), self.model(verifier)
    out = decoding.generate(method, q, p, qp, pp, **self.encode(examples),
                            **kwargs)
    return self.decode(out.sequences()), out


def metadata(assets: str = ASSETS) -> dict:
  """The shipped metadata/report JSON (corpus, sizes, quality, alpha)."""
  path = os.path.join(assets, METADATA)
  if not os.path.isfile(path):
    raise ValueError(f"the default models are not built ({path} is missing); "
                     f"{BUILD_HINT}")
  return _read_json(path)


def _read_json(path: str) -> dict:
  """A JSON file; a truncated or corrupt one is an error naming it."""
  try:
    with open(path) as f:
      return json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f"{path} is not valid JSON ({e}); the file is truncated "
                     f"or corrupt: restore it from the package (reinstall "
                     f"specdec_jax) or {BUILD_HINT}") from None


def load(name: str, dtype: str = "float32",
         assets: str = ASSETS) -> DefaultPair:
  """Loads a shipped default pair.

  Args:
    name: one of :data:`PAIRS` (or 'default-t5' / 'default-gemma').
    dtype: 'float32' or 'bfloat16': parameter and compute dtype.
    assets: the assets directory (default: the one inside the package).

  Returns:
    DefaultPair.
  """
  name = _check_name(name)
  if dtype not in ("float32", "bfloat16"):
    raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {dtype!r}")
  spec = TASKS[name]
  root = os.path.join(assets, name)
  needed = [os.path.join(root, TOKENIZER)] + [
      os.path.join(root, LEVEL_DIRS[lv], f) for lv in ("small", "large")
      for f in (native.CONFIG, native.PARAMS)]
  missing = [p for p in needed if not os.path.isfile(p)]
  if missing:
    raise ValueError(f"the default pair {name!r} is not built ({missing[0]} "
                     f"is missing); {BUILD_HINT}")
  tok = tokenizer_lib.Tokenizer(os.path.join(root, TOKENIZER), spec.family,
                                extra_ids=0)
  loaded = {}
  for level in LEVELS:
    path = os.path.join(root, LEVEL_DIRS[level])
    if level == "medium" and not os.path.exists(path):
      loaded[level] = (None, None)  # a 2-level build: no medium model
      continue
    if level == "medium" and not native.is_native(path):
      lost = [f for f in (native.CONFIG, native.PARAMS)
              if not os.path.isfile(os.path.join(path, f))]
      raise ValueError(f"the default pair {name!r} has an incomplete medium "
                       f"model ({os.path.join(path, lost[0] if lost else '')}"
                       f" is missing); restore it from the package, or delete "
                       f"{path} to use the 2-level pair")
    model, params = native.load(path, dtype=dtype)
    cfg = dataclasses.replace(model.config, dtype=dtype, param_dtype=dtype)
    loaded[level] = (model_from_config(cfg), params)
    tokenizer_lib.check_fits_model(tok, cfg.vocab_size, level)
    if cfg.vocab_size != tok.vocab_size:
      raise ValueError(f"{name} {level} model embeds {cfg.vocab_size} ids but "
                       f"its tokenizer has {tok.vocab_size}; rebuild the "
                       f"assets")
  info = {}
  if os.path.isfile(os.path.join(assets, METADATA)):
    info = metadata(assets).get("pairs", {}).get(name, {})
  (drafter, q), (medium, m), (verifier, p) = (loaded[lv] for lv in LEVELS)
  return DefaultPair(name=name, drafter=drafter, verifier=verifier,
                     q_params=q, p_params=p, tokenizer=tok,
                     metrics=spec.metrics,
                     max_new_tokens=spec.max_new_tokens,
                     is_encoder_decoder=verifier.is_encoder_decoder,
                     spec=spec, info=info, medium=medium, m_params=m)


@functools.lru_cache(maxsize=1)
def _warn_if_corpus_differs(corpus_hash: str, assets: str) -> None:
  path = os.path.join(assets, METADATA)
  if not os.path.isfile(path):
    return
  shipped = _read_json(path).get("corpus", {}).get("corpus_hash")
  if shipped and shipped != corpus_hash:
    warnings.warn(
        f"this Python's standard library (corpus hash {corpus_hash[:12]}) "
        f"differs from the one the default models were trained and evaluated "
        f"on ({shipped[:12]}); examples and scores will differ slightly from "
        f"docs/default_models.md", stacklevel=3)


def examples(name: str, split: str = "test", limit: int | None = None,
             root: str | None = None) -> list[dict]:
  """The task's examples of one split, in a fixed order (source order).

  Args:
    name: one of :data:`PAIRS`.
    split: 'train', 'validation' or 'test'.
    limit: keep the first ``limit`` examples (None: all).
    root: stdlib directory to read (default: this interpreter's).

  Returns:
    [{'id', 'inputs', 'targets'}], extracted from the local stdlib.
  """
  name = _check_name(name)
  if split not in corpus_lib.SPLITS:
    raise ValueError(f"split must be one of {corpus_lib.SPLITS}, got "
                     f"{split!r}")
  if limit is not None and limit < 0:
    raise ValueError(f"limit must be >= 0 or None, got {limit}")
  corpus = corpus_lib.default_corpus(root)
  _warn_if_corpus_differs(corpus.corpus_hash, ASSETS)
  out = corpus.examples[name][split]
  return [dict(e) for e in (out if limit is None else out[:limit])]


class BenchmarkPair(tuple):
  """(drafter, verifier, q_params, p_params) plus tokenized test examples.

  Attributes:
    prompts: Gemma: BOS-prefixed prompt ids of the test examples (else None).
    inputs: T5: encoder ids of the test examples (else None).
    pair: the DefaultPair.
  """

  def __new__(cls, pair: DefaultPair, rows: dict):
    obj = super().__new__(cls, (pair.drafter, pair.verifier, pair.q_params,
                                pair.p_params))
    obj.pair = pair
    obj.prompts = rows.get("prompts")
    obj.inputs = rows.get("inputs")
    return obj


def load_pair_for_benchmark(name: str, limit: int | None = 64
                            ) -> BenchmarkPair:
  """A default pair as the 4-tuple ``scripts/bench_decode.py`` unpacks.

  Args:
    name: a pair name or 'default-t5' / 'default-gemma'.
    limit: number of test examples tokenized into ``.prompts``/``.inputs``.
  """
  pair = load(name)
  return BenchmarkPair(pair, pair.encode(examples(pair.name, "test", limit)))


__all__ = [
    "ASSETS", "BENCHMARK_NAMES", "BenchmarkPair", "DefaultPair", "LEVELS",
    "LEVEL_DIRS", "PAIRS",
    "SPM_OPTIONS", "TASKS", "TaskSpec", "encode_inputs", "encode_targets",
    "examples", "load", "load_pair_for_benchmark", "metadata",
]
