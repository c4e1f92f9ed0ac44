"""Corpus extraction on a small synthetic stdlib-like directory."""

import os
import textwrap

import pytest

from specdec_jax.families import corpus

MOD = textwrap.dedent('''\
    """Module docstring."""
    import os


    def area(w, h):
        """Return the area of a w x h box.

        More text here.
        """
        # the product
        return w * h


    class Shape:
        """A shape."""

        @property
        def name(self):
            """The shape's name, e.g. square. Not used."""

            value = self._name
            return value.upper()

        def helper(self, x,
                   y=1):
            """Combine x
            and y!"""
            def inner():
                """Nested helper does a thing."""
                return 1
            return inner() + x + y


    def undocumented():
        return 1


    def stub():
        """Only a stub."""
        pass


    def same_line():
        """Docstring."""; return 2


    def sig():
        """sig(a, b) -> int"""
        return 0


    def short():
        """Short."""
        return 0


    def long_line():
        """Has a very long first body line."""
        x = "''' + "a" * 200 + '''"
        return x


    def blank_after():
        """Stops at a blank line."""
        a = 1

        b = 2
''')


def write(root, rel, text, encoding="utf-8"):
  path = os.path.join(root, rel)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "wb") as f:
    f.write(text.encode(encoding))


@pytest.fixture()
def stdlib(tmp_path):
  root = str(tmp_path / "lib")
  write(root, "pkg/shapes.py", MOD)
  write(root, "pkg/__init__.py", "")
  # An exact copy of `area` in another file: deduplicated.
  write(root, "copy_of_area.py", MOD.split("class Shape")[0])
  write(root, "latin.py", "# -*- coding: latin-1 -*-\n"
        "def f():\n    \"\"\"Caf\xe9 au lait.\"\"\"\n    return 'caf\xe9'\n",
        encoding="latin-1")
  write(root, "broken.py", "def f(:\n")
  for skipped in ("test/test_shapes.py", "site-packages/third.py",
                  "idlelib/idle_test/test_x.py", "_sysconfigdata_x.py",
                  "config-3.11-x86_64/makefile.py"):
    write(root, skipped, MOD)
  return root


def functions(root, rel):
  with open(os.path.join(root, rel), "rb") as f:
    text = corpus.decode_source(f.read())
  return {fn.qualname: fn for fn in corpus.extract_functions(text, rel)}


def test_list_files_skips_noise_directories(stdlib):
  assert corpus.list_files(stdlib) == [
      "broken.py", "copy_of_area.py", "latin.py", "pkg/__init__.py",
      "pkg/shapes.py"]


def test_list_files_rejects_missing_root(tmp_path):
  with pytest.raises(ValueError, match="is not a directory"):
    corpus.list_files(str(tmp_path / "nope"))


def test_extract_functions_parts(stdlib):
  fns = functions(stdlib, "pkg/shapes.py")
  assert sorted(fns) == [
      "Shape.helper", "Shape.helper.<locals>.inner", "Shape.name", "area",
      "blank_after", "long_line", "short", "sig"]
  area = fns["area"]
  assert area.id == "pkg/shapes.py:5:area"
  assert area.signature == "def area(w, h):\n"
  assert area.docstring_source == ('    """Return the area of a w x h box.'
                                   '\n\n    More text here.\n    """')
  assert area.docstring == ("Return the area of a w x h box.\n\n"
                            "More text here.")
  assert area.body == ("    # the product", "    return w * h")
  name = fns["Shape.name"]  # decorator kept, blank line after doc skipped
  assert name.lineno == 17
  assert name.signature == "@property\ndef name(self):\n"
  assert name.body == ("    value = self._name", "    return value.upper()")
  helper = fns["Shape.helper"]
  assert helper.signature == "def helper(self, x,\n           y=1):\n"
  assert helper.docstring_source == '    """Combine x\n    and y!"""'


def test_t5_examples_exact(stdlib):
  fns = functions(stdlib, "pkg/shapes.py")
  ex = corpus.docstring_example(fns["area"])
  assert ex == {"id": "pkg/shapes.py:5:area",
                "inputs": "def area(w, h):\n    # the product\n"
                          "    return w * h",
                "targets": "Return the area of a w x h box."}
  ex = corpus.docstring_example(fns["Shape.name"])
  assert ex["inputs"] == ("@property\ndef name(self):\n"
                          "    value = self._name\n    return value.upper()")
  assert ex["targets"] == "The shape's name, e.g. square."
  ex = corpus.docstring_example(fns["Shape.helper"])
  assert ex["targets"] == "Combine x and y!"
  assert ex["inputs"] == (
      "def helper(self, x,\n           y=1):\n    def inner():\n"
      "        \"\"\"Nested helper does a thing.\"\"\"\n        return 1\n"
      "    return inner() + x + y")
  stats = {}
  assert corpus.docstring_example(fns["sig"], stats) is None
  assert corpus.docstring_example(fns["short"], stats) is None
  assert stats == {"t5_skip_signature_docstring": 1,
                   "t5_skip_short_target": 1}


def test_t5_source_is_cut_at_whole_lines():
  fn = corpus.Function(path="x.py", qualname="f", lineno=1,
                       signature="def f():\n", docstring_source='"""D o."""',
                       docstring="D o.",
                       body=tuple(f"x{i:03d} = {i}" for i in range(200)))
  stats = {}
  ex = corpus.docstring_example(fn, stats)
  lines = ex["inputs"].split("\n")
  assert lines[0] == "def f():" and lines[1:4] == ["x000 = 0", "x001 = 1",
                                                   "x002 = 2"]
  assert len(ex["inputs"]) <= corpus.MAX_SOURCE_CHARS
  assert len(ex["inputs"]) + len("x999 = 99") + 2 > corpus.MAX_SOURCE_CHARS
  assert stats == {"t5_truncated_source": 1}


def test_gemma_examples_exact(stdlib):
  fns = functions(stdlib, "pkg/shapes.py")
  ex = corpus.completion_example(fns["area"])
  assert ex == {"id": "pkg/shapes.py:5:area",
                "inputs": 'def area(w, h):\n    """Return the area of a w x '
                          'h box.\n\n    More text here.\n    """\n',
                "targets": "    # the product\n    return w * h"}
  ex = corpus.completion_example(fns["Shape.name"])
  assert ex["inputs"] == ('@property\ndef name(self):\n    """The shape\'s '
                          'name, e.g. square. Not used."""\n')
  assert ex["targets"] == "    value = self._name\n    return value.upper()"
  # The target stops at a blank line.
  assert corpus.completion_example(fns["blank_after"])["targets"] == \
      "    a = 1"
  stats = {}
  assert corpus.completion_example(fns["long_line"], stats) is None
  assert stats == {"gemma_skip_long_first_line": 1}


def test_first_sentence():
  assert corpus.first_sentence("Return x. More.") == "Return x."
  assert corpus.first_sentence("Use e.g. foo. Bar.") == "Use e.g. foo."
  assert corpus.first_sentence("Spans\n  two lines.\n\nOther.") == \
      "Spans two lines."
  assert corpus.first_sentence("No period\nat all\n\nx.") == "No period at all"
  assert corpus.first_sentence("Is it? Yes.") == "Is it?"
  assert corpus.first_sentence("Version 3.11 is out. Yes.") == \
      "Version 3.11 is out."


def test_split_of_is_stable_and_balanced():
  # Pinned values: changing the hash rule would silently change the splits.
  assert corpus.split_of("os.py") == corpus.split_of("os.py")
  got = {p: corpus.split_of(p) for p in ("os.py", "json/decoder.py",
                                         "asyncio/tasks.py", "ast.py")}
  assert got == {"os.py": "train", "json/decoder.py": "validation",
                 "asyncio/tasks.py": "test", "ast.py": "train"}
  assert corpus.split_of("asyncio/tasks.py", seed=1) != "test" or \
      corpus.split_of("os.py", seed=1) != "train"
  counts = {s: 0 for s in corpus.SPLITS}
  for i in range(4000):
    counts[corpus.split_of(f"pkg{i}/mod.py")] += 1
  assert abs(counts["test"] / 4000 - 0.10) < 0.02
  assert abs(counts["validation"] / 4000 - 0.05) < 0.015


def test_build_dedups_splits_by_file_and_is_deterministic(stdlib):
  c = corpus.build(stdlib)
  assert c.files == ("broken.py", "copy_of_area.py", "latin.py",
                     "pkg/__init__.py", "pkg/shapes.py")
  assert c.stats["files_unparsable"] == 1
  ids = {t: [e["id"] for s in corpus.SPLITS for e in c.examples[t][s]]
         for t in corpus.TASKS}
  # `area` is first met in copy_of_area.py; its copy in pkg/ is dropped.
  assert "copy_of_area.py:5:area" in ids["t5_docstring"]
  assert "pkg/shapes.py:5:area" not in ids["t5_docstring"]
  assert c.stats["t5_docstring_skip_duplicate"] == 1
  assert sorted(ids["t5_docstring"]) == sorted([
      "copy_of_area.py:5:area", "latin.py:2:f", "pkg/shapes.py:17:Shape.name",
      "pkg/shapes.py:24:Shape.helper",
      "pkg/shapes.py:28:Shape.helper.<locals>.inner",
      "pkg/shapes.py:57:long_line", "pkg/shapes.py:63:blank_after"])
  latin = [e for s in corpus.SPLITS for e in c.examples["t5_docstring"][s]
           if e["id"] == "latin.py:2:f"]
  assert latin[0]["targets"] == "Caf\xe9 au lait."
  # Every example sits in its file's split.
  for task in corpus.TASKS:
    for split in corpus.SPLITS:
      for e in c.examples[task][split]:
        assert corpus.split_of(e["id"].split(":")[0]) == split
  again = corpus.build(stdlib)
  assert again.examples == c.examples
  assert again.corpus_hash == c.corpus_hash
  assert again.examples_hash("t5_docstring") == c.examples_hash(
      "t5_docstring")


def test_corpus_hash_tracks_file_contents(stdlib):
  before = corpus.build(stdlib).corpus_hash
  write(stdlib, "latin.py", "x = 1\n")
  assert corpus.build(stdlib).corpus_hash != before


def test_t5_codegen_examples_are_the_gemma_completion_examples(stdlib):
  """'t5_codegen' is the Gemma task's data as sequence-to-sequence: the same
  examples in the same splits, as separate copies."""
  c = corpus.build(stdlib)
  assert corpus.SAME_EXAMPLES == {"t5_codegen": "gemma_completion"}
  assert c.examples["t5_codegen"] == c.examples["gemma_completion"]
  assert c.examples["t5_codegen"]["train"]
  assert c.examples["t5_codegen"]["train"][0] is not \
      c.examples["gemma_completion"]["train"][0]
  assert c.examples_hash("t5_codegen") == c.examples_hash("gemma_completion")
  for split in corpus.SPLITS:
    assert c.stats[f"t5_codegen_{split}"] == c.stats[
        f"gemma_completion_{split}"]
