"""Local JSONL / TSV example loading and writing."""

import json
import os
import subprocess
import sys

import pytest

from specdec_jax.eval import datasets


def _write(path, text):
  with open(path, "w", encoding="utf-8") as f:
    f.write(text)
  return str(path)


def test_jsonl_fields_ids_and_targets(tmp_path):
  path = _write(tmp_path / "qa.jsonl", "\n".join([
      json.dumps({"id": 7, "question": "Who?", "answers": ["Ann", "Anna"]}),
      "",  # blank lines are skipped but still counted
      json.dumps({"question": "Wo ist’s?", "answers": "Berlin"}),
      json.dumps({"question": "None?", "answers": []}),
  ]) + "\n")
  got = datasets.load(path, inputs_key="question", targets_key="answers")
  assert got == [
      {"id": "7", "inputs": "Who?", "targets": ["Ann", "Anna"]},
      {"id": "qa.jsonl:3", "inputs": "Wo ist’s?", "targets": "Berlin"},
      {"id": "qa.jsonl:4", "inputs": "None?", "targets": []},
  ]
  assert datasets.load(path, "question", None, limit=2) == [
      {"id": "7", "inputs": "Who?"},
      {"id": "qa.jsonl:3", "inputs": "Wo ist’s?"}]
  assert datasets.load(path, "question", limit=0) == []


def test_jsonl_dotted_keys(tmp_path):
  rec = {"id": "a", "question": "q", "answers": {"text": ["x", "y"]}}
  path = _write(tmp_path / "squad.jsonl", json.dumps(rec) + "\n")
  got = datasets.load(path, "question", "answers.text")
  assert got == [{"id": "a", "inputs": "q", "targets": ["x", "y"]}]


def test_tsv_header_and_fields(tmp_path):
  with_header = _write(tmp_path / "a.tsv",
                       "src\tref\nHallo Welt\tHello world\n\nJa\tYes\n")
  got = datasets.load(with_header, inputs_key="src", targets_key="ref")
  assert got == [
      {"id": "a.tsv:2", "inputs": "Hallo Welt", "targets": "Hello world"},
      {"id": "a.tsv:4", "inputs": "Ja", "targets": "Yes"}]
  no_header = _write(tmp_path / "b.txt", "x1\ty1\r\nx2\ty2\n")
  got = datasets.load(no_header, fields=("inputs", "targets"))
  assert got == [{"id": "b.txt:1", "inputs": "x1", "targets": "y1"},
                 {"id": "b.txt:2", "inputs": "x2", "targets": "y2"}]


def test_glob_reads_files_in_sorted_order(tmp_path):
  for name, q in (("part-1.jsonl", "second"), ("part-0.jsonl", "first")):
    _write(tmp_path / name, json.dumps({"inputs": q, "targets": "t"}) + "\n")
  got = datasets.load(str(tmp_path / "part-*.jsonl"))
  assert [(e["id"], e["inputs"]) for e in got] == [
      ("part-0.jsonl:1", "first"), ("part-1.jsonl:1", "second")]


def test_write_jsonl_round_trip(tmp_path):
  records = [{"id": "1", "inputs": "Grüße", "targets": ["a", "b"]},
             {"id": "2", "inputs": "x", "targets": "y"}]
  path = str(tmp_path / "out" / "new" / "preds.jsonl")
  assert datasets.write_jsonl(path, records) == 2
  with open(path, encoding="utf-8") as f:
    text = f.read()
  assert "Grüße" in text and text.count("\n") == 2
  assert datasets.load(path) == records
  assert os.listdir(os.path.dirname(path)) == ["preds.jsonl"]
  with pytest.raises(TypeError, match="record 1 must be a mapping"):
    datasets.write_jsonl(path, [["not", "a", "dict"]])
  assert datasets.load(path) == records  # the failed write left it intact


def test_missing_file_and_empty_glob(tmp_path):
  with pytest.raises(FileNotFoundError, match="does not exist"):
    datasets.load(str(tmp_path / "nope.jsonl"))
  with pytest.raises(FileNotFoundError, match="matches no file"):
    datasets.load(str(tmp_path / "*.jsonl"))


def test_malformed_lines_give_file_and_line(tmp_path):
  path = _write(tmp_path / "bad.jsonl",
                '{"inputs": "a", "targets": "b"}\n{"inputs": "a",\n')
  with pytest.raises(datasets.DatasetError,
                     match=r"bad\.jsonl:2: not valid JSON"):
    datasets.load(path)
  path = _write(tmp_path / "list.jsonl", "[1, 2]\n")
  with pytest.raises(datasets.DatasetError,
                     match=r"list\.jsonl:1: expected a JSON object"):
    datasets.load(path)
  path = _write(tmp_path / "bad.tsv", "inputs\ttargets\na\tb\tc\n")
  with pytest.raises(datasets.DatasetError,
                     match=r"bad\.tsv:2: 3 tab-separated fields, expected 2"):
    datasets.load(path)


def test_missing_or_wrong_fields(tmp_path):
  path = _write(tmp_path / "f.jsonl",
                json.dumps({"question": "q", "answer": "a"}) + "\n")
  with pytest.raises(datasets.DatasetError,
                     match=r"f\.jsonl:1: no field 'inputs' \(fields: "
                     r"\['answer', 'question'\]\)"):
    datasets.load(path)
  with pytest.raises(datasets.DatasetError, match="no field 'answers.text'"):
    datasets.load(path, "question", "answers.text")
  path = _write(tmp_path / "g.jsonl",
                json.dumps({"inputs": "q", "targets": [1, 2]}) + "\n")
  with pytest.raises(datasets.DatasetError,
                     match="'targets' must be a string or a list of strings"):
    datasets.load(path)
  path = _write(tmp_path / "h.jsonl",
                json.dumps({"inputs": 3, "targets": "t"}) + "\n")
  with pytest.raises(datasets.DatasetError, match="'inputs' must be a string"):
    datasets.load(path)


def test_duplicate_ids(tmp_path):
  line = json.dumps({"id": "x", "inputs": "a", "targets": "b"})
  path = _write(tmp_path / "d.jsonl", f"{line}\n{line}\n")
  with pytest.raises(datasets.DatasetError,
                     match=r"d\.jsonl:2: duplicate id 'x' \(first at "):
    datasets.load(path)


def test_format_errors(tmp_path):
  path = _write(tmp_path / "data.csv", "a,b\n")
  with pytest.raises(ValueError, match="cannot tell the format"):
    datasets.load(path)
  with pytest.raises(ValueError, match="format must be one of"):
    datasets.load(path, format="csv")
  path = _write(tmp_path / "data.csv", "inputs\ttargets\nq\tt\n")
  assert datasets.load(path, format="tsv")[0]["targets"] == "t"


def test_eval_modules_import_no_tensorflow():
  code = ("import sys, specdec_jax.eval.metrics, specdec_jax.eval.datasets\n"
          "bad = sorted({m.split('.')[0] for m in sys.modules} &\n"
          "             {'tensorflow', 'seqio', 'tensorflow_datasets'})\n"
          "assert not bad, bad\n")
  root = os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))))
  subprocess.run([sys.executable, "-c", code], check=True, cwd=root,
                 env={**os.environ, "PYTHONPATH": root}, timeout=120)
