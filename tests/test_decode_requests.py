"""Decode requests are read strictly: every bad line is named with its reason."""

import pytest

from specdec_jax import decode_requests as dr

VOCAB = dr.Vocab(size=64, encoder_decoder=False, bos_id=2, eos_id=1)


def _read(tmp_path, text: bytes | str, name="req.jsonl", vocab=VOCAB):
  path = tmp_path / name
  path.write_bytes(text.encode() if isinstance(text, str) else text)
  return dr.read_requests(str(path), vocab), str(path)


@pytest.mark.parametrize("line,message", [
    ('{"tokens": "217"}', "'tokens' must be a JSON list of integer ids, got "
     "the string '217'; write it as a list: [217]"),
    ('{"tokens": "2 17 5"}', "'tokens' must be a JSON list of integer ids, "
     "got the string '2 17 5'; write it as a list: [2, 17, 5]"),
    ('{"tokens": 17.7}', "'tokens' must be a JSON list of integer ids, got "
     "float 17.7"),
    ('{"tokens": 17}', "'tokens' must be a JSON list of integer ids, got "
     "int 17"),
    ('{"tokens": [2, 3.7]}', "'tokens' must be integers, got 3.7 at position "
     "1"),
    ('{"tokens": [2, 3.0]}', "'tokens' must be integers, got 3.0 at position "
     "1"),
    ('{"tokens": [2, true]}', "'tokens' must be integers, got True at "
     "position 1"),
    ('{"tokens": [2, 64]}', "token id 64 at position 1 is outside the "
     "vocabulary [0, 64)"),
    ('{"tokens": [-1]}', "token id -1 at position 0 is outside the "
     "vocabulary [0, 64)"),
    ('{"tokens": []}', "'tokens' is empty; a request needs at least one "
     "token"),
    ('{"tokens": [2], "inputs": "x"}', "a request needs exactly one of "
     "'inputs' (text) or 'tokens' (a list of ids), not both"),
    ('{"id": "a"}', "a request needs exactly one of 'inputs' (text) or "
     "'tokens' (a list of ids)"),
    ('{"inputs": "hello"}', "the request has text but no tokenizer is "
     "configured; set ModelSpec.tokenizer or give 'tokens'"),
    ('{"inputs": 5}', "'inputs' must be a string (text), got int 5; put ids "
     "in 'tokens'"),
    ('{"tokens": [2], "id": [1]}', "'id' must be a string or an integer, got "
     "list [1]"),
    ('{"tokens": [2, 5]', "not valid JSON (Expecting ',' delimiter at column "
     "18)"),
    ('[2, 5]', "expected a JSON object with 'inputs' (text) or 'tokens' "
     "(ids), got list [2, 5]"),
])
def test_each_bad_line_is_named_with_its_reason(tmp_path, line, message):
  (good, errors), path = _read(tmp_path, '{"tokens": [2, 9]}\n' + line + "\n")
  assert [r.ids for r in good] == [(2, 9)]
  assert len(errors) == 1
  assert str(errors[0]) == f"{path}:2 (request '1'): {message}"


def test_non_utf8_names_the_file_and_line(tmp_path):
  (good, errors), path = _read(
      tmp_path, b'{"tokens": [2, 9]}\n\n{"tokens": [2], "id": "caf\xe9"}\n')
  assert len(good) == 1
  assert str(errors[0]) == (f"{path}:3 (request '1'): not valid UTF-8 (byte "
                            f"0xe9 at column 27); save the file as UTF-8")


def test_ids_positions_duplicates_and_bos(tmp_path):
  (good, errors), path = _read(
      tmp_path, '{"tokens": [5, 6], "id": "a"}\n\n{"tokens": [2, 7]}\n'
      '{"tokens": [8], "id": "a"}\n{"tokens": [9], "id": 7}\n')
  assert [(r.id, r.line, r.ids) for r in good] == [
      ("a", 1, (2, 5, 6)), ("1", 3, (2, 7)), ("7", 5, (2, 9))]
  assert [str(e) for e in errors] == [
      f"{path}:4 (request 'a'): id 'a' is used by line 1 already; ids must "
      f"be unique"]


def test_text_lines_and_empty_files(tmp_path):
  with pytest.raises(ValueError, match=r"no requests found in .*req.txt"):
    _read(tmp_path, "\n  \n", name="req.txt")
  with pytest.raises(ValueError, match="input file not found: /nope.jsonl"):
    dr.read_requests("/nope.jsonl", VOCAB)
  (good, errors), _ = _read(tmp_path, "plain text\n", name="req.txt")
  assert not good and "has text but no tokenizer" in str(errors[0])


def test_fit_input_worked_examples():
  assert dr.fit_input([5, 6, 7, 8, 9, 1], 4, True, eos_id=1) == [5, 6, 7, 1]
  assert dr.fit_input([5, 6, 7, 8, 9], 4, True, eos_id=1) == [5, 6, 7, 8]
  assert dr.fit_input([2, 5, 6, 7, 8, 9], 4, False, bos_id=2) == [2, 7, 8, 9]
  assert dr.fit_input([5, 6, 7, 8, 9], 4, False, bos_id=2) == [6, 7, 8, 9]
  assert dr.fit_input([2, 5], 4, False, bos_id=2) == [2, 5]
  assert dr.fit_input([2, 5, 6], None, False, bos_id=2) == [2, 5, 6]


def test_long_requests_are_cut_and_marked(tmp_path):
  vocab = dr.Vocab(size=64, encoder_decoder=False, bos_id=2, eos_id=1,
                   max_input_tokens=4)
  (good, _), _ = _read(tmp_path, '{"tokens": [2, 10, 11, 12, 13, 14]}\n'
                       '{"tokens": [2, 10]}\n', vocab=vocab)
  assert [(r.ids, r.input_tokens, r.truncated) for r in good] == [
      ((2, 12, 13, 14), 6, True), ((2, 10), 2, False)]
