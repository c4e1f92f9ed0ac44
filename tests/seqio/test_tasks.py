"""seqio tasks: preprocessors, local-file tasks and metrics (skip w/o seqio).

Nothing is downloaded: the TFDS-named tasks run on hand-made examples with
the TFDS feature keys, through a FunctionDataSource in place of TFDS.
"""

import importlib
import json
import sys

import pytest

from specdec_jax import tokenizer

CORPUS = [
    "translate English to German: the house is small",
    "das Haus ist klein", "summarize: a storm hit the coast. power is out.",
    "Question: who sat on the mat?\nAnswer: the cat",
    "Context: cats sit on mats. Question: who sits? Answer: cats",
    "Natalia sold 48 clips. #### 72", "def add(a, b):\n    return a + b",
    "You are an expert Python programmer, and here is your task: add",
    "assert add(1, 2) == 3",
] * 20


def test_import_guard_names_the_extra(monkeypatch):
  """Without seqio, importing specdec_jax.seqio says what to install."""
  monkeypatch.setitem(sys.modules, "seqio", None)  # `import seqio` now fails
  for mod in ("specdec_jax.seqio", "specdec_jax.seqio.tasks",
              "specdec_jax.seqio.preprocessors"):
    monkeypatch.delitem(sys.modules, mod, raising=False)
  with pytest.raises(ImportError,
                     match=r"pip install 'specdec_jax\[seqio\]'"):
    importlib.import_module("specdec_jax.seqio")


@pytest.fixture(scope="module")
def sj():
  pytest.importorskip("seqio")
  return importlib.import_module("specdec_jax.seqio")


@pytest.fixture(scope="module")
def seqio(sj):
  del sj
  return importlib.import_module("seqio")


@pytest.fixture(scope="module")
def tf(sj):
  del sj
  return importlib.import_module("tensorflow")


@pytest.fixture(scope="module")
def spm_path(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("spm") / "tiny.model")
  # Keep whitespace as is (like Gemma's tokenizer) so code survives decoding.
  tokenizer.train(CORPUS, 320, "t5", path=path,
                  normalization_rule_name="identity",
                  remove_extra_whitespaces=False)
  return path


@pytest.fixture(scope="module")
def vocab(sj, spm_path):
  return sj.sentencepiece_vocabulary(spm_path)


@pytest.fixture(scope="module")
def tok(spm_path):
  """Our own tokenizer over the same model: an independent id reference."""
  return tokenizer.Tokenizer(spm_path, "t5", extra_ids=0)


def _source(seqio, tf, rows, signature, split="validation"):
  """A FunctionDataSource yielding ``rows`` (TFDS-shaped dicts)."""
  def dataset_fn(split, shuffle_files, seed=None):
    del split, shuffle_files, seed
    return tf.data.Dataset.from_generator(lambda: iter(rows),
                                          output_signature=signature)
  return seqio.FunctionDataSource(dataset_fn, splits=[split])


def _examples(task, split="validation", sequence_length=None):
  ds = task.get_dataset(sequence_length, split=split, shuffle=False)
  return list(ds.as_numpy_iterator())


def _check_text_and_ids(ex, tok, inputs, targets):
  assert ex["inputs_pretokenized"].decode() == inputs
  assert ex["targets_pretokenized"].decode() == targets
  assert ex["inputs"].tolist() == tok.encode(inputs, add_eos=True)
  assert ex["targets"].tolist() == tok.encode(targets, add_eos=True)


def _evaluate(seqio, task, predictions, vocab, split="validation"):
  """Runs seqio's Evaluator with fixed predictions; returns the metrics."""
  seqio.TaskRegistry.add_provider(task.name, task)
  try:
    ev = seqio.Evaluator(task.name, seqio.EncDecFeatureConverter(pack=False),
                         eval_split=split, async_compute_metrics=False,
                         use_memory_cache=False)
    ids = [vocab.encode(p) + [1] for p in predictions]
    width = max(map(len, ids))
    def predict_fn(ds):
      return [(i, ids[i] + [0] * (width - len(ids[i]))) for i, _ in ds]
    return ev.evaluate(compute_metrics=True,
                       predict_fn=predict_fn)[0].result()[task.name]
  finally:
    seqio.TaskRegistry.remove(task.name)


# ------------------------------------------- TFDS-named benchmark tasks


def _str(tf):
  return tf.TensorSpec([], tf.string)


def _strs(tf):
  return tf.TensorSpec([None], tf.string)


def test_wmt14_en_de(sj, seqio, tf, vocab, tok):
  rows = [{"de": "das Haus ist klein", "en": "the house is small"}]
  src = _source(seqio, tf, rows, {"de": _str(tf), "en": _str(tf)})
  task = sj.make_benchmark_task("wmt14_en_de", vocab, source=src)
  [ex] = _examples(task)
  _check_text_and_ids(ex, tok, "translate English to German: the house is "
                      "small", "das Haus ist klein")
  got = _evaluate(seqio, task, ["das Haus ist klein"], vocab)
  assert got == {"bleu": pytest.approx(100.0)}


@pytest.mark.parametrize("bench,article,summary", [
    ("cnn_dailymail", "article", "highlights"),
    ("xsum", "document", "summary")])
def test_summarization(sj, seqio, tf, vocab, tok, bench, article, summary):
  rows = [{article: "a storm hit the coast.", summary: "power is out."}]
  src = _source(seqio, tf, rows, {article: _str(tf), summary: _str(tf)})
  task = sj.make_benchmark_task(bench, vocab, source=src)
  [ex] = _examples(task)
  _check_text_and_ids(ex, tok, "summarize: a storm hit the coast.",
                      "power is out.")
  assert task.name == f"specdec_{bench}"


def test_cnn_dailymail_rouge_through_evaluator(sj, seqio, tf, vocab):
  rows = [{"article": "x", "highlights": "the cat sat on the mat"},
          {"article": "y", "highlights": "a b c"}]
  src = _source(seqio, tf, rows, {"article": _str(tf), "highlights": _str(tf)})
  task = sj.make_benchmark_task("cnn_dailymail", vocab, source=src)
  got = _evaluate(seqio, task, ["the cat sat on a mat", "x y z"], vocab)
  # Example 1: rouge1 5/6, rouge2 3/5 (see tests/eval); example 2: 0.
  assert got == {"rouge1": pytest.approx(100 * 5 / 12),
                 "rouge2": pytest.approx(30.0),
                 "rougeLsum": pytest.approx(100 * 5 / 12)}


def test_gsm8k(sj, seqio, tf, vocab, tok):
  answer = "Natalia sold 48 clips.\n#### 72"
  rows = [{"question": "How many?", "answer": answer,
           "annotation": "Natalia sold 48 clips.\n", "short_answer": "72"}]
  src = _source(seqio, tf, rows, {k: _str(tf) for k in rows[0]}, "test")
  task = sj.make_benchmark_task("gsm8k", vocab, source=src)
  [ex] = _examples(task, "test")
  _check_text_and_ids(ex, tok, "Question: How many?\nAnswer:", answer)
  got = _evaluate(seqio, task, ["48 + 24 = 72"], vocab, "test")
  assert got == {"gsm8k_accuracy": 100.0}


def test_squad_v2_answers_and_no_answer(sj, seqio, tf, vocab, tok):
  sig = {"id": _str(tf), "title": _str(tf), "context": _str(tf),
         "question": _str(tf), "is_impossible": tf.TensorSpec([], tf.bool),
         "answers": {"text": _strs(tf),
                     "answer_start": tf.TensorSpec([None], tf.int32)},
         "plausible_answers": {"text": _strs(tf),
                               "answer_start": tf.TensorSpec([None],
                                                             tf.int32)}}
  none = {"text": [], "answer_start": []}
  rows = [{"id": "q1", "title": "T", "context": "cats sit on mats.",
           "question": "who sits?", "is_impossible": False,
           "answers": {"text": ["cats", "the cats"], "answer_start": [0, 0]},
           "plausible_answers": none},
          {"id": "q2", "title": "T", "context": "cats sit on mats.",
           "question": "who flies?", "is_impossible": True, "answers": none,
           "plausible_answers": {"text": ["cats"], "answer_start": [0]}}]
  task = sj.make_benchmark_task("squad_v2", vocab,
                                source=_source(seqio, tf, rows, sig))
  ex1, ex2 = _examples(task)
  _check_text_and_ids(ex1, tok, "Context: cats sit on mats.\nQuestion: who "
                      "sits?\nAnswer:", "cats")
  assert ex1["answers"].tolist() == [b"cats", b"the cats"]
  assert ex1["id"] == b"q1"
  assert ex2["targets_pretokenized"] == b"" and ex2["targets"].tolist() == [1]
  assert ex2["answers"].tolist() == []
  # "the cats" matches a gold answer; "" is right for the unanswerable one.
  assert _evaluate(seqio, task, ["The cats.", ""], vocab) == {
      "exact_match": 100.0, "f1": 100.0}
  assert _evaluate(seqio, task, ["cats sit", "cats"], vocab) == {
      "exact_match": 0.0, "f1": pytest.approx(100 * (2 / 3) / 2)}


@pytest.mark.parametrize("bench,key,split", [
    ("web_questions", "answers", "test"),
    ("natural_questions_open", "answer", "validation")])
def test_closed_book_qa(sj, seqio, tf, vocab, tok, bench, key, split):
  rows = [{"question": "who sat on the mat?", key: ["the cat", "a cat"]}]
  sig = {"question": _str(tf), key: _strs(tf)}
  if bench == "web_questions":
    rows[0]["url"] = "http://x"
    sig["url"] = _str(tf)
  task = sj.make_benchmark_task(bench, vocab,
                                source=_source(seqio, tf, rows, sig, split))
  [ex] = _examples(task, split)
  _check_text_and_ids(ex, tok, "Question: who sat on the mat?\nAnswer:",
                      "the cat")
  assert ex["answers"].tolist() == [b"the cat", b"a cat"]
  assert _evaluate(seqio, task, ["A cat!"], vocab, split) == {
      "exact_match": 100.0, "f1": 100.0}


def test_trivia_qa(sj, seqio, tf, vocab, tok):
  answer = {"aliases": ["The Cat", "Felix"], "normalized_aliases": ["cat"],
            "matched_wiki_entity_name": "", "normalized_value": "cat",
            "normalized_matched_wiki_entity_name": "", "type": "Wikipedia",
            "value": "The Cat"}
  rows = [{"question": "who sat on the mat?", "question_id": "tq1",
           "question_source": "", "answer": answer}]
  sig = {"question": _str(tf), "question_id": _str(tf),
         "question_source": _str(tf),
         "answer": {k: _strs(tf) if "aliases" in k else _str(tf)
                    for k in answer}}
  task = sj.make_benchmark_task("trivia_qa", vocab,
                                source=_source(seqio, tf, rows, sig))
  [ex] = _examples(task)
  _check_text_and_ids(ex, tok, "Question: who sat on the mat?\nAnswer:",
                      "The Cat")
  assert ex["answers"].tolist() == [b"The Cat", b"Felix"]
  assert _evaluate(seqio, task, ["felix"], vocab) == {
      "exact_match": 100.0, "f1": 100.0}


def test_register_tasks_uses_tfds_names(sj, seqio, vocab):
  names = sj.register_tasks(vocab, prefix="t1_",
                            prompt_prefix={"gsm8k": "Q: 1+1?\nA: 2\n\n"})
  try:
    assert names == ["t1_wmt14_en_de", "t1_cnn_dailymail", "t1_xsum",
                     "t1_gsm8k", "t1_squad_v2", "t1_web_questions",
                     "t1_natural_questions_open", "t1_trivia_qa"]
    want = {"t1_wmt14_en_de": "wmt14_translate/de-en:1.0.0",
            "t1_squad_v2": "squad/v2.0:3.0.0",
            "t1_trivia_qa": "trivia_qa/rc.nocontext:1.1.0",
            "t1_natural_questions_open": "natural_questions_open:1.0.0"}
    for name, tfds_name in want.items():
      source = seqio.get_mixture_or_task(name).source
      assert isinstance(source, seqio.TfdsDataSource)
      assert source.tfds_dataset.name == tfds_name
    assert tuple(seqio.get_mixture_or_task("t1_gsm8k").splits) == (
        "train", "test")
    with pytest.raises(ValueError, match="already registered; pass "
                       "overwrite=True"):
      sj.register_tasks(vocab, prefix="t1_", benchmarks=["xsum"])
    assert sj.register_tasks(vocab, prefix="t1_", benchmarks=["xsum"],
                             overwrite=True) == ["t1_xsum"]
  finally:
    for n in names:
      seqio.TaskRegistry.remove(n)


def test_prompt_prefix_is_prepended(sj, seqio, tf, vocab):
  rows = [{"question": "q?", "answer": "#### 2", "annotation": "",
           "short_answer": "2"}]
  src = _source(seqio, tf, rows, {k: _str(tf) for k in rows[0]}, "test")
  task = sj.make_benchmark_task("gsm8k", vocab, source=src,
                                prompt_prefix="Question: 1+1?\nAnswer: 2\n\n")
  [ex] = _examples(task, "test")
  assert ex["inputs_pretokenized"] == (b"Question: 1+1?\nAnswer: 2\n\n"
                                       b"Question: q?\nAnswer:")


def test_benchmark_errors(sj, vocab):
  with pytest.raises(ValueError, match="unknown benchmark 'wmt'"):
    sj.make_benchmark_task("wmt", vocab)
  with pytest.raises(ValueError, match="not in TFDS; pass source= or use "
                     "register_mbpp_task"):
    sj.make_benchmark_task("mbpp", vocab)
  with pytest.raises(ValueError, match=r"not registered here: \['xsum'\]"):
    sj.register_tasks(vocab, benchmarks=["gsm8k"],
                      prompt_prefix={"xsum": "x"})
  with pytest.raises(TypeError, match="must be a seqio.Vocabulary"):
    sj.output_features("spm.model")
  with pytest.raises(FileNotFoundError, match="does not exist"):
    sj.sentencepiece_vocabulary("/nonexistent/spm.model")
  with pytest.raises(ValueError, match="unknown metric"):
    sj.metric_fn(["accuracy"])


# --------------------------------------------------------- local files


def test_local_jsonl_task(sj, seqio, vocab, tok, tmp_path):
  path = tmp_path / "qa.jsonl"
  path.write_text("\n".join(json.dumps(r) for r in [
      {"question": "who sat on the mat?", "answers": ["the cat", "a cat"]},
      {"id": "x9", "question": "who flies?", "answers": []},
      {"question": "what is small?", "answers": "the house"}]) + "\n")
  task = sj.register_local_task("local_qa", str(path), vocab,
                                inputs_key="question", targets_key="answers",
                                prompt_prefix="Q: ")
  try:
    exs = _examples(task)
    assert [e["id"] for e in exs] == [b"qa.jsonl:1", b"x9", b"qa.jsonl:3"]
    _check_text_and_ids(exs[0], tok, "Q: who sat on the mat?", "the cat")
    assert [e["answers"].tolist() for e in exs] == [
        [b"the cat", b"a cat"], [], [b"the house"]]
    assert exs[1]["targets_pretokenized"] == b""
    # Trimming keeps EOS last (append_eos_after_trim).
    trimmed = _examples(task, sequence_length={"inputs": 4, "targets": 3})
    assert trimmed[0]["inputs"].tolist() == \
        tok.encode("Q: who sat on the mat?")[:3] + [1]
    assert trimmed[0]["targets"].tolist() == tok.encode("the cat")[:2] + [1]
  finally:
    seqio.TaskRegistry.remove("local_qa")
  got = _evaluate(seqio, task, ["A cat", "", "a small house"], vocab)
  assert got == {"exact_match": pytest.approx(200 / 3),
                 "f1": pytest.approx(100 * (1 + 1 + 2 / 3) / 3)}


def test_local_tsv_task_with_splits_and_bleu(sj, seqio, vocab, tok,
                                             tmp_path):
  (tmp_path / "dev.tsv").write_text(
      "src\tref\nthe house is small\tdas Haus ist klein\n")
  (tmp_path / "test.tsv").write_text("the cat\tdie Katze\n")
  task = sj.register_local_task(
      "local_mt", {"validation": str(tmp_path / "dev.tsv")}, vocab,
      inputs_key="src", targets_key="ref", metrics=["bleu"])
  try:
    [ex] = _examples(task)
    _check_text_and_ids(ex, tok, "the house is small", "das Haus ist klein")
  finally:
    seqio.TaskRegistry.remove("local_mt")
  assert _evaluate(seqio, task, ["das Haus ist klein"], vocab) == {
      "bleu": pytest.approx(100.0)}
  task = sj.register_local_task("local_mt2", str(tmp_path / "test.tsv"),
                                vocab, split="test", format="tsv",
                                fields=("inputs", "targets"))
  try:
    assert list(task.splits) == ["test"]
    [ex] = _examples(task, "test")
    assert ex["targets_pretokenized"] == "die Katze".encode()
  finally:
    seqio.TaskRegistry.remove("local_mt2")


def test_local_task_errors(sj, seqio, vocab, tmp_path):
  path = tmp_path / "qa.jsonl"
  path.write_text(json.dumps({"question": "q", "answer": "a"}) + "\n")
  with pytest.raises(FileNotFoundError, match="does not exist"):
    sj.register_local_task("bad", str(tmp_path / "no.jsonl"), vocab)
  with pytest.raises(ValueError, match=r"qa\.jsonl:1: no field 'inputs'"):
    sj.register_local_task("bad", str(path), vocab)
  with pytest.raises(ValueError, match=r"unknown metric\(s\) \['rouge'\]"):
    sj.register_local_task("bad", str(path), vocab, metrics=["rouge"],
                           inputs_key="question", targets_key="answer")
  assert "bad" not in seqio.TaskRegistry.names()


# --------------------------------------------------------------- MBPP


def test_mbpp_task(sj, seqio, vocab, tok, tmp_path):
  code = "def add(a, b):\n    return a + b"
  rows = [{"task_id": 2, "text": "prompt example", "code": "pass",
           "test_list": ["assert True"]},
          {"task_id": 11, "text": "add two numbers", "code": code,
           "test_list": ["assert add(1, 2) == 3", "assert add(0, 0) == 0"],
           "test_setup_code": "", "challenge_test_list": []},
          {"task_id": 600, "text": "v", "code": "pass", "test_list": []}]
  path = tmp_path / "mbpp.jsonl"
  path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
  task = sj.register_mbpp_task(str(path), vocab, name="t_mbpp")
  try:
    [ex] = _examples(task, "test")
    _check_text_and_ids(
        ex, tok, "You are an expert Python programmer, and here is your task: "
        "add two numbers Your code should pass these tests:\n\nassert "
        "add(1, 2) == 3\nassert add(0, 0) == 0", code)
    assert [e["task_id"] for e in _examples(task, "prompt")] == [2]
    [val] = _examples(task, "validation")
    assert val["inputs_pretokenized"].endswith(b"tests:\n\n")
  finally:
    seqio.TaskRegistry.remove("t_mbpp")
  got = _evaluate(seqio, task, [f"```python\n{code}\n```"], vocab, "test")
  assert got == {"code_exact_match": 100.0}
