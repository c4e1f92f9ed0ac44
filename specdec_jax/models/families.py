"""The ONE table of model families: what each family is made of.

Every place that needs to know the families reads this table (model from
config, the parameter-axes check, the CLI's input limits and tokenizer
layout, the t5x adapter's model rebuild); a new family (Gemma 3 is next)
is its own files (config + model module, checkpoint converters) plus ONE
row here.

    fam = families.of_model(model)     # Family('t5', ...)
    fam.max_input_tokens               # 512
    families.get("gemma").hf_model_types   # ('gemma', 'gemma2')
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Mapping

from specdec_jax.models.gemma import GEMMA_PRESETS, GemmaConfig, GemmaModel
from specdec_jax.models.t5 import T5_PRESETS, T5Config, T5Model


@dataclasses.dataclass(frozen=True)
class Family:
  """One model family.

  Attributes:
    name: the family's name ('t5', 'gemma'): tokenizer layout, CLI.
    config_cls: its config dataclass.
    model_cls: its FlaxDecodeModel class (``model_cls(config)``).
    presets: preset name -> config.
    encoder_decoder: whether its models are encoder-decoder.
    hf_model_types: HF ``config.json`` ``model_type`` values it reads.
    special_ids: the tokenizer's special ids (pad, eos, unk, bos; -1: none).
    extra_ids: sentinel ids at the end of the vocabulary (T5: 100).
    add_bos: whether prompts start with BOS.
    max_input_tokens: default input limit of random / checkpoint models
      (T5 v1.1 pre-trained on 512-token inputs; Gemma 8192-token context).
    converters: checkpoint format -> module (dotted path) that converts
      that format to this family's parameters (imported when used, so
      models never import checkpoints); the formats of
      ``checkpoints.loader.FORMATS`` (and 'gguf') a family can load / save.
    special_pieces: the tokenizer's special pieces when one is trained
      (``tokenizer.train``).
    hf_later_types: further HF ``model_type`` values the same classes read
      (later versions of the family: Gemma 3's 'gemma3_text').
  """

  name: str
  config_cls: type
  model_cls: type
  presets: Mapping[str, object]
  encoder_decoder: bool
  hf_model_types: tuple[str, ...]
  special_ids: Mapping[str, int]
  extra_ids: int
  add_bos: bool
  max_input_tokens: int
  converters: Mapping[str, str]
  special_pieces: Mapping[str, str]
  hf_later_types: tuple[str, ...] = ()

  def converter(self, fmt: str):
    """The module converting checkpoint format ``fmt`` (e.g. 'hf')."""
    if fmt not in self.converters:
      raise ValueError(f"{self.name} models have no {fmt!r} checkpoint "
                       f"converter; formats: {', '.join(self.converters)}")
    return importlib.import_module(self.converters[fmt])


FAMILIES: tuple[Family, ...] = (
    Family("t5", T5Config, T5Model, T5_PRESETS, True, ("t5", "mt5"),
           dict(pad_id=0, eos_id=1, unk_id=2, bos_id=-1), 100, False, 512,
           {"hf": "specdec_jax.checkpoints.hf_t5",
            "t5x": "specdec_jax.checkpoints.t5x",
            "t5x_orbax": "specdec_jax.checkpoints.t5x",
            "native": "specdec_jax.checkpoints.native"},
           dict(pad_piece="<pad>", eos_piece="</s>", unk_piece="<unk>")),
    Family("gemma", GemmaConfig, GemmaModel, GEMMA_PRESETS, False,
           ("gemma", "gemma2"), dict(pad_id=0, eos_id=1, bos_id=2, unk_id=3),
           0, True, 8192,
           {"hf": "specdec_jax.checkpoints.hf_gemma",
            "gemma": "specdec_jax.checkpoints.gemma_official",
            "gguf": "specdec_jax.checkpoints.gguf",
            "native": "specdec_jax.checkpoints.native"},
           dict(pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>",
                unk_piece="<unk>"),
           hf_later_types=("gemma3_text",)),
)
BY_NAME: dict[str, Family] = {f.name: f for f in FAMILIES}


def names() -> tuple[str, ...]:
  """The families' names, in table order."""
  return tuple(BY_NAME)


def get(name: str) -> Family:
  """The family ``name``; ValueError naming the known ones otherwise."""
  if name not in BY_NAME:
    raise ValueError(f"unknown model family {name!r}; known: "
                     f"{', '.join(BY_NAME)}")
  return BY_NAME[name]


def of_hf_type(model_type: str | None) -> Family | None:
  """The family reading HF ``config.json`` ``model_type`` (None: none)."""
  for fam in FAMILIES:
    if model_type in fam.hf_model_types + fam.hf_later_types:
      return fam
  return None


def _family_of(obj, attr: str, what: str) -> Family:
  """The family whose ``attr`` class ``obj`` is an instance of."""
  for fam in FAMILIES:
    if isinstance(obj, getattr(fam, attr)):
      return fam
  raise ValueError(f"expected a {what} of "
                   f"{' or '.join(getattr(f, attr).__name__ for f in FAMILIES)}"
                   f", got {type(obj).__name__}")


def of_config(config) -> Family:
  """The family of a config object."""
  return _family_of(config, "config_cls", "config")


def of_model(model) -> Family:
  """The family of a model (an early exit included)."""
  return _family_of(model, "model_cls", "model")


def model_classes() -> tuple[type, ...]:
  return tuple(f.model_cls for f in FAMILIES)


def config_classes() -> tuple[type, ...]:
  return tuple(f.config_cls for f in FAMILIES)
