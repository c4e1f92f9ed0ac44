"""Trees and hierarchies through the t5x Models (no t5x needed): greedy
tokens equal target-only, statistics equal decoding.generate's /
generate_hierarchy's, bad options are clear errors before anything runs,
and the shipped gin options build."""

import os
import sys
import types

import gin
import numpy as np
import pytest

from specdec_jax import decoding, models
from specdec_jax.decoding.hierarchy.api import generate_hierarchy
from specdec_jax.decoding.loops import program as program_lib
from specdec_jax.t5x import models as t5x_models
from tests.t5x.test_models import (LENGTH, Vocab, _encdec, _encdec_batch,
                                   _predict, _src)
from tests.decoding.pairs import tiny_pair

Topology = decoding.Topology
KARY = decoding.Tree(Topology.kary(2, 2))
EAGLE = decoding.Tree(Topology.from_paths([[0], [1], [2], [0, 0], [1, 0]]),
                      "top_k")
GIN_T5X = os.path.join(os.path.dirname(__file__), "..", "..", "gin", "t5x")


def _target_only(model, params, src):
  return decoding.generate(decoding.TargetOnly(), model.drafter,
                           model.verifier, params["draft"], params["target"],
                           inputs=src, max_new_tokens=LENGTH)


def test_greedy_tree_through_t5x_equals_target_only():
  model, params = _encdec(tree=KARY, score_decodes=False)
  src = _src()
  ref = _target_only(model, params, src)
  decodes, aux = _predict(model, params, _encdec_batch(src), jit=True)
  np.testing.assert_array_equal(decodes, ref.tokens)
  np.testing.assert_array_equal(aux["tokens"], ref.lengths)
  # One verifier call per block of 6 nodes, fewer calls than target-only.
  np.testing.assert_array_equal(aux["drafted"], 6 * aux["verifier_calls"])
  assert aux["verifier_calls"].sum() < ref.verifier_calls.sum()
  assert 0 < aux["accepted"].sum() < aux["drafted"].sum()


def test_sampled_tree_through_decoder_only_model_is_generate():
  """Gemma, top-k children, a cascade rule, sampled: the Model's seed and
  example ids give decoding.generate's tokens and counters."""
  d, v, qp, pp = tiny_pair("gemma")
  model = t5x_models.SpeculativeDecoderOnlyModel(
      d, v, Vocab(), method="token_v3", method_knobs={"alpha": 0.4},
      sampling=decoding.Temperature(1.0), seed=5, tree=EAGLE,
      score_decodes=False)
  dec = np.zeros((3, LENGTH), np.int32)
  dec[0, :4], dec[1, :2], dec[2, :3] = [0, 9, 4, 6], [0, 5], [0, 7, 7]
  causal = (dec != 0).astype(np.int32)
  causal[:, 0] = 1
  batch = {"decoder_input_tokens": dec, "decoder_causal_attention": causal,
           "example_id": np.array([3, 1, 4])}
  decodes, aux = _predict(model, {"draft": qp, "target": pp}, batch)
  bos = v.config.bos_id
  gen = decoding.generate(decoding.make_method("token_v3", alpha=0.4), d, v,
                          qp, pp, [[bos, 9, 4, 6], [bos, 5], [bos, 7, 7]],
                          tree=EAGLE, seeds=5, request_ids=[3, 1, 4],
                          max_new_tokens=[LENGTH - 3, LENGTH - 1,
                                          LENGTH - 2],
                          sampling=decoding.Temperature(1.0))
  np.testing.assert_array_equal(decodes[:, :LENGTH - 1], gen.tokens)
  np.testing.assert_array_equal(aux["accepted"], gen.accepted)
  np.testing.assert_array_equal(aux["verifier_calls"], gen.verifier_calls)
  np.testing.assert_allclose(aux["deferrals"], gen.deferrals, rtol=1e-6)
  assert 0 < aux["accepted"].sum() < aux["drafted"].sum()


def test_greedy_hierarchy_through_t5x_equals_target_only():
  hierarchy = t5x_models.Hierarchy(exits=(1,), buffers=(2, 4))
  model, params = _encdec(hierarchy=hierarchy, score_decodes=False)
  src = _src()
  decodes, aux = _predict(model, params, _encdec_batch(src), jit=True)
  ref = _target_only(model, params, src)
  np.testing.assert_array_equal(decodes, ref.tokens)
  d, v, qp, pp = model.drafter, model.verifier, params["draft"], params[
      "target"]
  levels = [(d, qp), (models.early_exit(v, 1), pp), (v, pp)]
  gen = generate_hierarchy(levels, [2, 4], inputs=src, max_new_tokens=LENGTH)
  np.testing.assert_array_equal(aux["level_calls"], gen.calls)
  np.testing.assert_array_equal(aux["level_accepted"], gen.level_accepted)
  np.testing.assert_array_equal(aux["level_drafted"], gen.level_drafted)
  np.testing.assert_array_equal(aux["verifier_calls"], gen.verifier_calls)
  np.testing.assert_array_equal(aux["drafter_calls"], gen.drafter_calls)
  assert aux["level_calls"].shape == (4, 3)
  assert aux["verifier_calls"].sum() < ref.verifier_calls.sum()


@pytest.mark.parametrize("kwargs,message", [
    (dict(tree=decoding.Tree(Topology.kary(2, 2)),
          hierarchy=t5x_models.Hierarchy((1,), (2, 3))),
     "set at most one of tree and hierarchy"),
    (dict(tree=[-1, 2, 0]),
     "node 1 has parent 2, which is not an earlier node"),
    (dict(tree=()), "a draft tree needs at least one node, got zero nodes"),
    (dict(tree="kary"), "tree must be a decoding.Tree, a decoding.Topology "
     "or a list of parent indices"),
    (dict(tree=Topology.kary(65, 1)),
     "a node with 65 children but the vocabulary has only 64 tokens"),
    (dict(tree=KARY, method="bild"), "BiLD does not run on draft trees"),
    (dict(tree=KARY, method="target_only"),
     "TargetOnly does not run on draft trees"),
    (dict(tree=decoding.Tree(Topology.kary(2, 2), "iid"),
          method="lossy_greedy"),
     "LossyGreedy is greedy: i.i.d. children"),
    (dict(hierarchy=t5x_models.Hierarchy((2,), (2, 3))),
     "Hierarchy exit 2 is outside \\[1, 1\\]: the verifier has 2 decoder "
     "layers"),
    (dict(hierarchy=t5x_models.Hierarchy((1,), (2, 3)), method="bild"),
     "a hierarchy's top level verifies with a speculative method"),
    (dict(hierarchy=(1, 2)), "hierarchy must be a specdec_jax.t5x.models"
     ".Hierarchy"),
])
def test_bad_tree_or_hierarchy_raises_before_anything_compiles(kwargs,
                                                               message):
  before = len(program_lib._COMPILED)  # pylint: disable=protected-access
  with pytest.raises(ValueError, match=message):
    _encdec(**kwargs)
  assert len(program_lib._COMPILED) == before  # pylint: disable=protected-access


@pytest.mark.parametrize("kwargs,message", [
    (dict(exits=(), buffers=(2,)), "Hierarchy.exits is empty"),
    (dict(exits=(2, 2), buffers=(1, 2, 3)),
     "exits must be strictly increasing \\(cheapest level first\\), got "
     "\\[2, 2\\]"),
    (dict(exits=(1,), buffers=(2,)),
     "Hierarchy with 1 exit\\(s\\) has 3 levels and needs 2 buffers"),
    (dict(exits=(1,), buffers=(0, 2)), "buffers must all be >= 1, got "
     "\\[0, 2\\]"),
    (dict(exits=1, buffers=(2, 2)), "Hierarchy.exits must be a sequence of "
     "integers, got 1"),
])
def test_bad_hierarchy_objects(kwargs, message):
  with pytest.raises(ValueError, match=message):
    t5x_models.Hierarchy(**kwargs)


def _model_from_gin(monkeypatch, option, bindings):
  """spec_cascade_model.gin + an option gin, a tiny pair, built."""
  try:
    import seqio  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError:  # the model gin's `import seqio`: a stand-in module
    monkeypatch.setitem(sys.modules, "seqio", types.SimpleNamespace(
        __name__="seqio", SentencePieceVocabulary=lambda **kw: kw))
  texts = []
  for name in ("spec_cascade_model.gin", option):
    with open(os.path.join(GIN_T5X, name), encoding="utf-8") as f:
      texts.append(f.read())
  gin.clear_config()
  try:
    for text in texts:
      gin.parse_config(text)
    gin.parse_config("\n".join([
        "from __gin__ import dynamic_registration",
        "import tests.t5x.test_models",
        "VOCABULARY = @tests.t5x.test_models.Vocab()",
        "DRAFTER = 't5_tiny'", "VERIFIER = 't5_tiny'", *bindings]))
    return gin.query_parameter("%MODEL").scoped_configurable_fn()
  finally:
    gin.clear_config()


def test_tree_and_hierarchy_gin_options_build(monkeypatch):
  model = _model_from_gin(monkeypatch, "tree.gin",
                          ["TREE_PROPOSAL = 'top_k'"])
  assert model.tree == decoding.Tree(Topology.kary(2, 2), "top_k")
  assert model.drafting.kind == "tree"
  with pytest.raises(ValueError, match="Hierarchy exit 6 is outside"):
    _model_from_gin(monkeypatch, "hierarchy.gin", [])  # t5_tiny: 2 layers
  model = _model_from_gin(monkeypatch, "hierarchy.gin",
                          ["HIERARCHY_EXITS = (1,)",
                           "HIERARCHY_BUFFERS = (2, 5)"])
  assert model.hierarchy == t5x_models.Hierarchy((1,), (2, 5))
  assert [m.depth for m in model.drafting.models] == [2, 1, 2]
  assert model.drafting.param_keys == ("draft", "target", "target")
