"""SentencePiece tokenizers with T5 / Gemma layouts (trained here, tiny)."""

import inspect
import json

import pytest

from specdec_jax import tokenizer

TEXTS = [ln for ln in inspect.getsource(json).splitlines() if ln.strip()] * 2


@pytest.fixture(scope="module")
def t5_tok():
  return tokenizer.train(TEXTS, 600, "t5")


@pytest.fixture(scope="module")
def gemma_tok():
  return tokenizer.train(TEXTS, 600, "gemma")


def test_t5_layout_and_extra_ids(t5_tok):
  assert (t5_tok.pad_id, t5_tok.eos_id, t5_tok.unk_id) == (0, 1, 2)
  assert t5_tok.bos_id is None
  assert t5_tok.vocab_size == 600 + 100
  assert t5_tok.extra_id(0) == 699 and t5_tok.extra_id(99) == 600
  ids = t5_tok.encode("import json", add_eos=True)
  assert ids[-1] == 1 and 0 not in ids
  text = t5_tok.decode(t5_tok.encode("x = 1") + [t5_tok.extra_id(3)] +
                       t5_tok.encode("y") + [1, 55, 66])
  assert text == "x = 1<extra_id_3>y"  # stops at EOS


def test_gemma_layout_roundtrip(gemma_tok, tmp_path):
  assert (gemma_tok.pad_id, gemma_tok.eos_id, gemma_tok.bos_id,
          gemma_tok.unk_id) == (0, 1, 2, 3)
  ids = gemma_tok.encode("def loads(s):")
  assert ids[0] == 2
  assert gemma_tok.decode(ids) == "def loads(s):"
  path = tmp_path / "g.model"
  gemma_tok.save(str(path))
  again = tokenizer.Tokenizer(str(path), "gemma")
  assert again.fingerprint == gemma_tok.fingerprint
  assert again.encode("def loads(s):") == ids


def test_vocabulary_checks(t5_tok, gemma_tok):
  other = tokenizer.train(TEXTS[::-1][:200], 500, "t5")
  with pytest.raises(ValueError, match="tokenizers differ"):
    tokenizer.check_same_vocabulary(t5_tok, other)
  tokenizer.check_same_vocabulary(t5_tok, t5_tok)
  with pytest.raises(ValueError, match="tokenizer has 700 ids but the "
                     "verifier embeds only 640"):
    tokenizer.check_fits_model(t5_tok, 640, "verifier")


def test_wrong_layout_and_bad_files(gemma_tok, tmp_path):
  path = tmp_path / "g.model"
  gemma_tok.save(str(path))
  with pytest.raises(ValueError, match="does not follow the t5 special-id "
                     "layout: .*bos_id=2"):
    tokenizer.Tokenizer(str(path), "t5")
  with pytest.raises(ValueError, match="does not exist"):
    tokenizer.Tokenizer(str(tmp_path / "missing.model"))
  bad = tmp_path / "bad.model"
  bad.write_bytes(b"not a model")
  with pytest.raises(ValueError, match="not a valid SentencePiece model"):
    tokenizer.Tokenizer(str(bad))
