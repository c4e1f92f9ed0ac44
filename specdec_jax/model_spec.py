"""Where a model comes from: :class:`ModelSpec` (the CLI's model source).

The CLI modules import one way: ``runs`` (eval) -> ``decode_run`` (decode)
-> ``hierarchy_spec`` (stacks of ModelSpecs / early exits) -> this module,
which imports none of them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import jax
import numpy as np

from specdec_jax import decode_requests, models
from specdec_jax import tokenizer as tokenizer_lib
from specdec_jax.models import families

# Built-in defaults of ModelSpec.max_input_tokens for random and checkpoint
# models (the families table): T5 v1.1 was pre-trained on 512-token inputs
# (t5x's default 'inputs' feature length); Gemma 1 and 2 have an 8192-token
# context.
DEFAULT_MAX_INPUT_TOKENS = {f.name: f.max_input_tokens
                            for f in families.FAMILIES}
CHECKPOINT_FORMATS = ("auto", "native", "hf", "t5x", "t5x_orbax", "gemma")
# ModelSpec roles; with a default_pair each names one of its models (and its
# asset directory).
ROLES = ("drafter", "medium", "verifier")
# Model-free drafters named by ModelSpec.preset (no checkpoint, no weights):
# prompt lookup (``models.NgramModel``) over the verifier's vocabulary;
# 'ngram' proposes one-hot chains, 'ngram_tree' spreads q over every match's
# continuation (for trees). The value is NgramModel's ``spread``.
NGRAM_PRESETS = {"ngram": False, "ngram_tree": True}


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """Where a model comes from.

  Exactly one source is used, in this order: ``default_pair`` (a built-in
  trained pair, see ``specdec_jax.eval.default_models``), ``checkpoint`` (any
  supported format, see ``specdec_jax.checkpoints``), else random weights
  for ``preset`` (for smoke tests and benchmarks only).

  Attributes:
    preset: model preset name (``specdec_jax.models.PRESETS``); required for
      checkpoints that carry no config (T5X, official Gemma). 'ngram' and
      'ngram_tree' (:data:`NGRAM_PRESETS`) are the model-free prompt-lookup
      drafter (``models.NgramModel``, params ``{}``): its vocabulary and
      stop token are the verifier's.
    checkpoint: checkpoint path (local or gs://).
    checkpoint_format: 'auto', 'native', 'hf', 't5x', 't5x_orbax', 'gemma'.
    dtype: parameter dtype after loading ('bfloat16' or 'float32').
    tokenizer: SentencePiece .model path (None: token ids in and out).
    default_pair: name of a built-in pair ('t5_codegen', ...).
    role: 'drafter', 'medium' or 'verifier': which model of a
      ``default_pair`` (small, medium, large; 'medium' is a hierarchy's
      middle level, gin/hierarchies/).
    seed: seed of random weights (>= 0).
    ngram_ns: the n-gram drafter's suffix lengths, longest first (only
      with an 'ngram' preset).
    max_input_tokens: the longest model input (T5: encoder ids incl. EOS;
      Gemma: prompt incl. BOS). Longer requests are cut to it with a warning
      (``decode_requests.fit_input``), in decode and eval alike. None: the
      built-in pair's task limit (320 for t5_codegen and
      gemma_completion), else :data:`DEFAULT_MAX_INPUT_TOKENS` of the family
      (T5 512, Gemma 8192). Only the verifier's applies.
  """

  preset: str | None = None
  checkpoint: str | None = None
  checkpoint_format: str = "auto"
  dtype: str = "float32"
  tokenizer: str | None = None
  default_pair: str | None = None
  role: str = "verifier"
  seed: int = 0
  max_input_tokens: int | None = None
  ngram_ns: tuple[int, ...] = (3, 2, 1)

  def __post_init__(self):
    if isinstance(self.ngram_ns, list):  # gin writes lists; keep it hashable
      object.__setattr__(self, "ngram_ns", tuple(self.ngram_ns))

  def check(self) -> None:
    """Cheap checks of every field (nothing loaded); raises ValueError."""
    what = f"the {self.role}'s ModelSpec"
    if self.role not in ROLES:
      raise ValueError(f"ModelSpec.role must be 'drafter', 'medium' or "
                       f"'verifier', got {self.role!r}")
    if self.dtype not in ("float32", "bfloat16"):
      raise ValueError(f"{what}: dtype must be 'float32' or 'bfloat16', got "
                       f"{self.dtype!r}")
    if self.checkpoint_format not in CHECKPOINT_FORMATS:
      raise ValueError(f"{what}: checkpoint_format must be one of "
                       f"{', '.join(CHECKPOINT_FORMATS)}, got "
                       f"{self.checkpoint_format!r}")
    if self.preset is not None and self.preset not in models.PRESETS and (
        self.preset not in NGRAM_PRESETS):
      raise ValueError(f"{what}: unknown preset {self.preset!r}; choose one of "
                       f"{', '.join(sorted([*models.PRESETS, *NGRAM_PRESETS]))}")
    if self.is_ngram and (self.checkpoint or self.default_pair):
      raise ValueError(f"{what}: preset {self.preset!r} is the model-free "
                       f"n-gram drafter; it takes no checkpoint or "
                       f"default_pair (unset them)")
    if self.is_ngram and (
        isinstance(self.ngram_ns, (str, bytes)) or not self.ngram_ns or
        any(_bad_int(n, 1, 2**16) for n in self.ngram_ns)):
      raise ValueError(f"{what}: ngram_ns must be a non-empty list of "
                       f"integers >= 1 (e.g. [3, 2, 1]), got "
                       f"{self.ngram_ns!r}")
    if not (self.default_pair or self.checkpoint or self.preset):
      raise ValueError(f"the {self.role} needs a preset, a checkpoint or a "
                       f"default_pair")
    for name, path in (("checkpoint", self.checkpoint),
                       ("tokenizer", self.tokenizer)):
      if path and not str(path).startswith("gs://") and not os.path.exists(
          path):
        raise ValueError(f"{what}: {name} {path!r} does not exist")
    if _bad_int(self.seed, 0, 2**32):
      raise ValueError(f"{what}: seed must be an integer in [0, 2**32), got "
                       f"{self.seed!r}")
    if self.max_input_tokens is not None and _bad_int(
        self.max_input_tokens, 2, 2**31):
      raise ValueError(f"{what}: max_input_tokens must be an integer >= 2 or "
                       f"None, got {self.max_input_tokens!r}")

  @property
  def is_ngram(self) -> bool:
    """True for the model-free n-gram drafter ('ngram' / 'ngram_tree')."""
    return self.preset in NGRAM_PRESETS

  def architecture(self, verifier_model=None):
    """The model object (config only, no parameters read; cheap).

    Args:
      verifier_model: the verifier's model object; the n-gram presets take
        their vocabulary and stop token from it (required for them, unused
        otherwise).
    """
    self.check()
    if self.is_ngram:
      if verifier_model is None:
        raise ValueError(f"the {self.role}'s ModelSpec (preset "
                         f"{self.preset!r}) takes its vocabulary from the "
                         f"verifier: pass verifier_model")
      return models.NgramModel(verifier_model.vocab_size,
                               ns=tuple(self.ngram_ns),
                               spread=NGRAM_PRESETS[self.preset],
                               eos_id=getattr(verifier_model, "eos_id", None))
    if self.default_pair:
      from specdec_jax.checkpoints import native  # pylint: disable=g-import-not-at-top
      from specdec_jax.eval import default_models  # pylint: disable=g-import-not-at-top
      name = default_models.BENCHMARK_NAMES.get(self.default_pair,
                                                self.default_pair)
      if name not in default_models.TASKS:
        raise ValueError(f"unknown default pair {self.default_pair!r}; "
                         f"available: {', '.join(default_models.PAIRS)}")
      path = os.path.join(default_models.ASSETS, name, self.role,
                          native.CONFIG)
      if not os.path.isfile(path) and self.role == "medium":
        raise ValueError(f"the default pair {name!r} has no medium model "
                         f"({path} is missing; assets built before medium "
                         f"models existed); {default_models.BUILD_HINT}")
      if not os.path.isfile(path):
        raise ValueError(f"the default pair {name!r} is not built ({path} is "
                         f"missing); {default_models.BUILD_HINT}")
      with open(path) as f:
        return models.model_from_config(native.config_from_dict(json.load(f)))
    if self.checkpoint:
      return _checkpoint_architecture(self)
    return models.get_model(self.preset)

  def input_limit(self, model=None) -> int:
    """The maximum input length (see ``max_input_tokens``)."""
    if self.max_input_tokens is not None:
      return int(self.max_input_tokens)
    if self.default_pair:
      from specdec_jax.eval import default_models  # pylint: disable=g-import-not-at-top
      name = default_models.BENCHMARK_NAMES.get(self.default_pair,
                                                self.default_pair)
      return default_models.TASKS[name].max_input_tokens
    model = model or self.architecture()
    return DEFAULT_MAX_INPUT_TOKENS[families.of_model(model).name]

  def load_tokenizer(self, model=None):
    """The Tokenizer (None without one); reads only the .model file."""
    if self.default_pair:
      from specdec_jax.eval import default_models  # pylint: disable=g-import-not-at-top
      name = default_models.BENCHMARK_NAMES.get(self.default_pair,
                                                self.default_pair)
      path = os.path.join(default_models.ASSETS, name,
                          default_models.TOKENIZER)
      return tokenizer_lib.Tokenizer(_read_bytes(path),
                                     default_models.TASKS[name].family,
                                     extra_ids=0)
    if not self.tokenizer:
      return None
    model = model or self.architecture()
    family = families.of_model(model).name
    tok = tokenizer_lib.Tokenizer(_read_bytes(self.tokenizer), family)
    tokenizer_lib.check_fits_model(tok, model.vocab_size, self.role)
    return tok

  def load(self, verifier_model=None):
    """Returns (model, params, tokenizer or None).

    Args:
      verifier_model: the verifier's model object (needed by the n-gram
        presets, see :meth:`architecture`).
    """
    self.check()
    if self.is_ngram:
      return self.architecture(verifier_model), {}, None
    if self.default_pair:
      from specdec_jax.eval import default_models  # pylint: disable=g-import-not-at-top
      pair = default_models.load(self.default_pair, dtype=self.dtype)
      level = {"drafter": "small", "medium": "medium",
               "verifier": "large"}[self.role]
      model, params = pair.model(level)
      return model, params, pair.tokenizer
    if self.checkpoint:
      from specdec_jax import checkpoints  # pylint: disable=g-import-not-at-top
      model, params = checkpoints.load(self.checkpoint, model=self.preset,
                                       format=self.checkpoint_format,
                                       dtype=self.dtype)
    else:
      model = models.get_model(self.preset)
      params = model.init_params(jax.random.PRNGKey(self.seed))
      print(f"note: {self.role} '{self.preset}' has RANDOM weights (no "
            f"checkpoint given)", file=sys.stderr)
    return model, params, self.load_tokenizer(model)


def _bad_int(x, lo: int, hi: int) -> bool:
  """True unless x is an int (not bool) in [lo, hi)."""
  return (isinstance(x, bool) or not isinstance(x, (int, np.integer))
          or not lo <= x < hi)


def _checkpoint_architecture(spec: ModelSpec):
  """The model of a checkpoint from its config.json, or from the preset."""
  # pylint: disable=g-import-not-at-top
  from specdec_jax.checkpoints import hf, loader, native
  fmt = spec.checkpoint_format
  if fmt == "auto":
    fmt = loader.detect_format(spec.checkpoint)
  if fmt == "native":
    with open(os.path.join(spec.checkpoint, native.CONFIG)) as f:
      try:
        meta = json.load(f)
      except json.JSONDecodeError as e:
        raise ValueError(f"{spec.checkpoint}/config.json is not valid JSON: "
                         f"{e}") from None
    return models.model_from_config(native.config_from_dict(meta))
  if fmt == "hf":
    return hf.model_from_hf_config(hf.read_config(spec.checkpoint),
                                   spec.checkpoint)[0]
  if spec.preset is None:
    raise ValueError(f"checkpoint {spec.checkpoint!r} ({fmt}) holds no model "
                     f"config: set the {spec.role}'s ModelSpec.preset")
  return models.get_model(spec.preset)


def _read_bytes(path: str) -> bytes:
  if path.startswith("gs://"):
    from etils import epath  # pylint: disable=g-import-not-at-top
    return epath.Path(path).read_bytes()
  if not os.path.isfile(path):
    raise ValueError(f"file not found: {path}")
  with open(path, "rb") as f:
    return f.read()


def vocab_of(drafter, verifier, uses_drafter: bool):
  """(verifier model, drafter model or None, decode_requests.Vocab) of
  the ModelSpecs of a run (the drafter only when ``uses_drafter``)."""
  v_model = verifier.architecture()
  d_model = drafter.architecture(v_model) if uses_drafter else None
  if d_model is not None and (
      d_model.vocab_size != v_model.vocab_size or
      d_model.is_encoder_decoder != v_model.is_encoder_decoder):
    raise ValueError(f"drafter and verifier do not match: "
                     f"{type(d_model).__name__} with {d_model.vocab_size} ids "
                     f"vs {type(v_model).__name__} with {v_model.vocab_size}; "
                     f"speculative decoding needs one vocabulary")
  v_tok = verifier.load_tokenizer(v_model)
  d_tok = drafter.load_tokenizer(d_model) if d_model is not None else None
  if d_tok is not None and v_tok is not None:
    tokenizer_lib.check_same_vocabulary(d_tok, v_tok)
  vocab = decode_requests.Vocab(
      size=v_model.vocab_size, encoder_decoder=v_model.is_encoder_decoder,
      tokenizer=v_tok or d_tok, bos_id=getattr(v_model.config, "bos_id", None),
      eos_id=getattr(v_model, "eos_id", None),
      max_input_tokens=verifier.input_limit(v_model))
  return v_model, d_model, vocab
