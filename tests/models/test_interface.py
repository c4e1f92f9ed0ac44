"""The DecodeModel protocol and check_decode_model."""

import dataclasses

import numpy as np
import pytest

from specdec_jax import models
from specdec_jax.models import cache as cache_lib
from specdec_jax.models.interface import (DecodeModel, EncoderDecoderModel,
                                          check_decode_model)


@dataclasses.dataclass(frozen=True)
class Minimal:
  """The smallest user model: a bigram table, no layers of its own."""

  vocab_size: int = 8
  eos_id: int | None = None
  is_encoder_decoder = False

  def init_cache(self, batch, max_length, encoded=None):
    return models.KVCache(
        lengths=np.zeros((batch,), np.int32),
        layers=cache_lib.init_layers(batch, max_length, 1, 1, 1, np.float32))

  def step(self, params, tokens, cache, *, positions=None, mask=None,
           logits_at=None):
    logits = params[tokens]  # [B, N, V]
    if logits_at is not None:
      logits = np.take_along_axis(logits, logits_at[:, None, None], axis=1)
    return logits, cache.with_lengths(cache.lengths + tokens.shape[1])


def test_builtin_families_and_a_user_model_satisfy_the_protocol():
  for name in ("t5_tiny", "gemma_tiny", "gemma2_tiny"):
    model = models.get_model(name)
    assert isinstance(model, DecodeModel)
    assert isinstance(model, EncoderDecoderModel) or name != "t5_tiny"
    check_decode_model(model, "verifier")
    check_decode_model(models.early_exit(model, 1), "drafter")
  assert isinstance(Minimal(), DecodeModel)
  assert not isinstance(Minimal(), EncoderDecoderModel)  # not needed
  check_decode_model(Minimal(), "drafter")


def _without(attr):
  """A plain class with Minimal's members except ``attr``."""
  ns = {"vocab_size": 8, "eos_id": None, "is_encoder_decoder": False,
        "init_cache": Minimal.init_cache, "step": Minimal.step}
  del ns[attr]
  return type("Broken", (), ns)()


@pytest.mark.parametrize("attr", ["vocab_size", "eos_id", "is_encoder_decoder",
                                  "init_cache", "step"])
def test_a_missing_member_is_named(attr):
  with pytest.raises(ValueError, match=f"drafter \\(Broken\\) has no "
                     f"(attribute|method) '{attr}'"):
    check_decode_model(_without(attr), "drafter")


def test_step_must_take_positions_mask_and_logits_at():
  class OldStep(Minimal):

    def step(self, params, tokens, cache, logits_at=None):
      return super().step(params, tokens, cache, logits_at=logits_at)

  with pytest.raises(ValueError, match="does not accept the keyword "
                     "'positions'"):
    check_decode_model(OldStep(), "verifier")

  class KwStep(Minimal):

    def step(self, params, tokens, cache, **kw):
      return super().step(params, tokens, cache, **kw)

  check_decode_model(KwStep(), "verifier")


def test_attribute_types_and_encoder_are_checked():
  with pytest.raises(ValueError, match="vocab_size must be a positive int"):
    check_decode_model(Minimal(vocab_size=0))
  with pytest.raises(ValueError, match="eos_id must be an int or None"):
    check_decode_model(Minimal(eos_id="1"))

  class Flagged(Minimal):
    masks_cached_slots = "yes"

  with pytest.raises(ValueError, match="masks_cached_slots must be a bool"):
    check_decode_model(Flagged())

  class EncDec(Minimal):
    is_encoder_decoder = True

  with pytest.raises(ValueError, match="has no method 'encode'"):
    check_decode_model(EncDec(), "verifier")
