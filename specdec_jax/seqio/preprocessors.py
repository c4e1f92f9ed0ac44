r"""tf.data preprocessors: raw benchmark examples -> text-to-text pairs.

Each maps one example of a TFDS dataset (feature keys as in
tensorflow-datasets 4.9.10) to ``{'inputs': str, 'targets': str}`` plus, for
question answering, ``'answers': [n] str`` (every gold answer, which the
metrics score against; ``targets`` is the first one, for teacher forcing).

    WMT14 en-de     inputs  "translate English to German: {en}"
                    targets "{de}"
    CNN/DM, XSum    inputs  "summarize: {article}"
                    targets "{highlights}" / "{summary}"
    GSM8K           inputs  "Question: {question}\nAnswer:"
                    targets "{answer}" (reasoning, then "#### 72")
    SQuAD 2.0       inputs  "Context: {context}\nQuestion: {question}\nAnswer:"
                    targets first answer, "" when unanswerable
    WebQuestions,   inputs  "Question: {question}\nAnswer:"
    NQ-open         targets first answer
    TriviaQA        inputs  "Question: {question}\nAnswer:"
                    targets "{answer.value}"; answers = answer.aliases
    MBPP            inputs  "You are an expert Python programmer, and here is
                            your task: {text} Your code should pass these
                            tests:\n\n{test_list, one a line}"
                    targets "{code}"

The T5 prefixes are t5's (``t5.data.preprocessors.translate/summarize``);
the question formats are ours (the paper's few-shot prompts are not public):
put exemplars in front with ``prompt_prefix``.
"""

import tensorflow as tf


def _first_or_empty(strings: tf.Tensor) -> tf.Tensor:
  """[n] string -> scalar: the first element, or '' when n == 0."""
  return tf.concat([strings, [""]], axis=0)[0]


def _join(*parts) -> tf.Tensor:
  return tf.strings.join(list(parts))


def translate_en_de(x):
  """WMT14 ``wmt14_translate/de-en``: features 'de', 'en'."""
  return {"inputs": _join("translate English to German: ", x["en"]),
          "targets": x["de"]}


def summarize(x, article_key: str, summary_key: str):
  """``cnn_dailymail`` (article/highlights), ``xsum`` (document/summary)."""
  return {"inputs": _join("summarize: ", x[article_key]),
          "targets": x[summary_key]}


def gsm8k(x):
  """``gsm8k``: question, answer ("...reasoning...\\n#### 72")."""
  return {"inputs": _join("Question: ", x["question"], "\nAnswer:"),
          "targets": x["answer"]}


def squad_v2(x):
  """``squad/v2.0``: id, context, question, answers/text ([n], empty when
  the question is unanswerable)."""
  answers = x["answers"]["text"]
  return {"inputs": _join("Context: ", x["context"], "\nQuestion: ",
                          x["question"], "\nAnswer:"),
          "targets": _first_or_empty(answers),
          "answers": answers,
          "id": x["id"]}


def closed_book_qa(x, answers_key: str):
  """``web_questions`` (answers) and ``natural_questions_open`` (answer):
  question plus a [n] string answer list."""
  answers = x[answers_key]
  return {"inputs": _join("Question: ", x["question"], "\nAnswer:"),
          "targets": _first_or_empty(answers),
          "answers": answers}


def trivia_qa(x):
  """``trivia_qa/rc.nocontext``: question, answer/value, answer/aliases."""
  return {"inputs": _join("Question: ", x["question"], "\nAnswer:"),
          "targets": x["answer"]["value"],
          "answers": x["answer"]["aliases"]}


def mbpp(x):
  """MBPP JSONL (google-research/mbpp): task_id, text, code, test_list
  ([n]); keeps task_id."""
  tests = tf.strings.reduce_join(x["test_list"], separator="\n")
  return {"inputs": _join("You are an expert Python programmer, and here is "
                          "your task: ", x["text"], " Your code should pass "
                          "these tests:\n\n", tests),
          "targets": x["code"],
          "task_id": x["task_id"]}


def add_prompt_prefix(x, prefix: str):
  """Prepends ``prefix`` (e.g. few-shot exemplars) to the inputs."""
  return {**x, "inputs": _join(prefix, x["inputs"])}
