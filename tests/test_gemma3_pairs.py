"""The gemma3_270m_*.gin pairs decode end to end through the CLI on a tiny
Gemma 3 GGUF written here (gemma3_tiny, 6 layers, 64 ids), and the n-gram
ModelSpec presets ('ngram', 'ngram_tree')."""

import json

import gin
import pytest

from specdec_jax import main, model_spec, models

gguf = pytest.importorskip("gguf")

from tests.checkpoints import test_gguf  # noqa: E402

PAIRS = ("target_only", "ngram", "ngram_tree", "early_exit", "cascade")
PROMPTS = [[2, 5, 9, 5, 9, 5], [2, 7, 7, 3]]


@pytest.fixture(autouse=True)
def clean_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def _decode(pair, gguf_path, req, out):
  gin.clear_config()
  main.parse_gin(["runs/decode.gin", f"pairs/gemma3_270m_{pair}.gin"], [
      f"GEMMA3_270M_CHECKPOINT = '{gguf_path}'",
      # the tiny stand-in for the 270M: its preset, no tokenizer (ids in)
      "gemma3_270m/ModelSpec.preset = 'gemma3_tiny'",
      "gemma3_270m/ModelSpec.tokenizer = None",
      f"INPUT_FILE = '{req}'", f"OUTPUT_DIR = '{out / pair}'",
      "MAX_NEW_TOKENS = 8", "EARLY_EXIT = 'exit:3'"])
  return main.run()


def test_gemma3_270m_pairs_decode_end_to_end_on_a_tiny_gguf(tmp_path,
                                                           monkeypatch):
  path = tmp_path / "tiny.gguf"
  # gemma3_tiny exactly (mlp 64: Q8_0 instead of the 256-wide Q4_K rows)
  monkeypatch.setitem(test_gguf.TYPES, "ffn_down",
                      gguf.GGMLQuantizationType.Q8_0)
  test_gguf.write_tiny(path, cfg=models.PRESETS["gemma3_tiny"])
  req = tmp_path / "req.jsonl"
  req.write_text("".join(json.dumps({"tokens": p}) + "\n" for p in PROMPTS))
  rows = {p: _decode(p, path, req, tmp_path) for p in PAIRS}
  want = [r["tokens"] for r in rows["target_only"]]
  assert [len(t) for t in want] == [8, 8]
  # Greedy speculation with the n-gram drafter (chain and tree) and the
  # early exit gives the target-only tokens exactly.
  for pair in ("ngram", "ngram_tree", "early_exit"):
    assert [r["tokens"] for r in rows[pair]] == want, pair
    assert all(r["drafted"] > 0 for r in rows[pair]), pair
  # The n-gram drafter finds the repeated [5, 9] of the first prompt.
  assert rows["ngram"][0]["accepted"] > 0
  # The cascade (lossy) decodes the full budget and reports deferrals.
  assert [len(r["tokens"]) for r in rows["cascade"]] == [8, 8]
  assert all("deferrals" in r for r in rows["cascade"])
  assert (tmp_path / "cascade" / "decodes.jsonl").exists()


def test_ngram_presets_build_from_the_verifier():
  verifier = models.get_model("gemma3_tiny")
  spec = model_spec.ModelSpec(preset="ngram_tree", role="drafter",
                              ngram_ns=[2, 1])
  model, params, tok = spec.load(verifier)
  assert isinstance(model, models.NgramModel) and params == {} and tok is None
  assert (model.vocab_size, model.ns, model.spread, model.eos_id) == (
      verifier.vocab_size, (2, 1), True, verifier.eos_id)
  assert hash(spec) == hash(model_spec.ModelSpec(
      preset="ngram_tree", role="drafter", ngram_ns=(2, 1)))
  assert not model_spec.ModelSpec(preset="ngram").architecture(
      verifier).spread
  with pytest.raises(ValueError, match="takes its vocabulary from the "
                     "verifier"):
    spec.architecture()
  with pytest.raises(ValueError, match="takes no checkpoint"):
    model_spec.ModelSpec(preset="ngram", checkpoint="/x").check()
  with pytest.raises(ValueError, match="ngram_ns must be"):
    model_spec.ModelSpec(preset="ngram", ngram_ns=[0]).check()
  with pytest.raises(ValueError, match="ngram_tree"):
    model_spec.ModelSpec(preset="ngram3").check()
