"""docs/t5x.md, sections 3 and 5: building MODEL from our gin in a script,
an override gin for bindings that need imports, custom sizes and
COMPUTE_DTYPE. Needs seqio (the model gin imports it), not t5x."""

import os

import gin
import pytest

from specdec_jax import models
from specdec_jax.t5x import base

seqio = pytest.importorskip("seqio")
from specdec_jax.t5x import models as sj_models  # pylint: disable=g-import-not-at-top,wrong-import-position

GIN_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "gin")

# The override gin of docs/t5x.md: bindings that name a configurable carry
# their imports, so they live in a small file rather than on the command line.
VOCAB_GIN = """\
from __gin__ import dynamic_registration
import seqio
VOCABULARY = @seqio.PassThroughVocabulary()
seqio.PassThroughVocabulary.size = 64
"""
CUSTOM_GIN = """\
from __gin__ import dynamic_registration
import specdec_jax.models
DRAFTER = @specdec_jax.models.T5Config()
specdec_jax.models.T5Config:
  vocab_size = 64
  d_model = 16
  num_heads = 2
  head_dim = 8
  num_encoder_layers = 1
  num_decoder_layers = 1
  mlp_dim = 32
"""


@pytest.fixture(autouse=True)
def clean_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def _build(tmp_path, files, bindings):
  """docs/t5x.md's script: parse the model gin, build MODEL."""
  paths = []
  for name, text in files.items():
    (tmp_path / name).write_text(text)
    paths.append(str(tmp_path / name))
  gin.add_config_file_search_path(GIN_DIR)
  gin.parse_config_files_and_bindings(["t5x/spec_cascade_model.gin", *paths],
                                      bindings)
  return gin.get_configurable(sj_models.SpeculativeEncoderDecoderModel)()


def test_model_from_gin_in_a_script_with_an_override_gin(tmp_path):
  model = _build(tmp_path, {"vocab.gin": VOCAB_GIN},
                 ["DRAFTER = 't5_tiny'", "VERIFIER = 't5_tiny'",
                  "ALPHA = 0.4", "COMPUTE_DTYPE = 'float32'"])
  assert isinstance(model, sj_models.SpeculativeEncoderDecoderModel)
  assert float(model.method.target.alpha) == 0.4 and model.gamma == 5
  assert model.verifier.config.dtype == "float32"
  assert isinstance(model.input_vocabulary, seqio.PassThroughVocabulary)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_compute_dtype_applies_to_a_custom_size(tmp_path, dtype):
  model = _build(tmp_path, {"vocab.gin": VOCAB_GIN, "custom.gin": CUSTOM_GIN},
                 ["VERIFIER = 't5_tiny'", f"COMPUTE_DTYPE = '{dtype}'"])
  assert model.drafter.config == models.T5Config(
      vocab_size=64, d_model=16, num_heads=2, head_dim=8,
      num_encoder_layers=1, num_decoder_layers=1, mlp_dim=32, dtype=dtype)
  assert model.verifier.config.dtype == dtype


def test_model_overrides_on_model_objects():
  t5 = models.get_model("t5_tiny")
  got = base._resolve_model(t5, {"dtype": "bfloat16"}, "drafter")  # pylint: disable=protected-access
  assert got.config == models.get_model("t5_tiny", dtype="bfloat16").config
  assert base._resolve_model(t5, None, "drafter") is t5  # pylint: disable=protected-access
  with pytest.raises(ValueError, match=r"^model_overrides for the drafter: "
                     r"T5Config has no field 'dtyp'$"):
    base._resolve_model(t5.config, {"dtyp": "float32"}, "drafter")  # pylint: disable=protected-access

  class Wrapped:
    step = init_params = None
  with pytest.raises(ValueError, match=r"^model_overrides \{'dtype': "
                     r"'float32'\} cannot be applied to the verifier, a "
                     r"Wrapped: build it with these settings"):
    base._resolve_model(Wrapped(), {"dtype": "float32"}, "verifier")  # pylint: disable=protected-access
