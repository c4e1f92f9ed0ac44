"""Pretraining-text selection on a synthetic stdlib and site-packages."""

import os

import pytest

from specdec_jax.families import corpus
from tests.families.test_corpus import MOD, stdlib, write  # pylint: disable=unused-import
from tools.default_models import pretraining

DOC = "Some documentation text.\n" * 20  # 500 bytes: above MIN_FILE_BYTES


@pytest.fixture()
def site(tmp_path):
  root = str(tmp_path / "site-packages")
  write(root, "pkg_a/core.py", "def g():\n    return 1\n" * 20)
  write(root, "pkg_a/README.md", DOC)
  write(root, "pkg_a-1.0.dist-info/METADATA", "Name: pkg_a\n" + DOC)
  write(root, "pkg_a-1.0.dist-info/RECORD", DOC)  # not a text we take
  write(root, "pkg_a/__pycache__/core.md", DOC)
  write(root, "pkg_a/tiny.txt", "x")  # below MIN_FILE_BYTES
  # This project's own distribution: its METADATA is our README.
  write(root, "specdec_jax-0.1.0.dist-info/METADATA", "Name: specdec_jax\n"
        + DOC)
  write(root, "__editable___specdec_jax_0_1_0_finder.py", "x = 1\n" * 100)
  write(root, "specdec_jax/decoding.py", "y = 2\n" * 100)
  return root


def test_site_files_skip_caches_and_this_project(site):
  assert pretraining.list_site_files(site) == [
      "pkg_a-1.0.dist-info/METADATA", "pkg_a/README.md", "pkg_a/core.py",
      "pkg_a/tiny.txt"]


def test_build_is_deterministic_and_independent_of_this_project(
    stdlib, site):
  c = corpus.build(stdlib)
  pre = pretraining.build(c, site)
  paths = pre.file_list()
  assert [p for p in paths if p.startswith("site-packages:")] == sorted(
      (f"site-packages:{p}" for p in ("pkg_a-1.0.dist-info/METADATA",
                                       "pkg_a/README.md", "pkg_a/core.py")),
      key=lambda p: pretraining._order_key(*p.split(":")))  # pylint: disable=protected-access
  assert pre.stats["skip_size"] == 1  # tiny.txt
  # Stdlib training-split files come first, held-out ones never.
  stdlib_paths = [p.split(":", 1)[1] for p in paths
                  if p.startswith("stdlib:")]
  assert stdlib_paths == [p for p in c.files  # the empty __init__: skipped
                          if corpus.split_of(p) == "train"
                          and p != "pkg/__init__.py"]
  assert len(stdlib_paths) >= 2
  # Rewriting this project's README (its METADATA) changes nothing.
  write(site, "specdec_jax-0.1.0.dist-info/METADATA", "new README\n" + DOC)
  again = pretraining.build(c, site)
  assert again.files_hash == pre.files_hash
  assert [d.text for d in again.documents] == [d.text for d in pre.documents]
  # ... while another package's text does.
  write(site, "pkg_a/README.md", "changed\n" + DOC)
  assert pretraining.build(c, site).files_hash != pre.files_hash


def test_max_bytes_stops_selection(stdlib, site):
  c = corpus.build(stdlib)
  pre = pretraining.build(c, site, max_bytes=1)
  assert len(pre.documents) == 1


def test_missing_site_packages_is_a_clear_error(tmp_path):
  with pytest.raises(ValueError, match="does not exist"):
    pretraining.list_site_files(os.path.join(str(tmp_path), "nope"))


SCALE = '''\
def scale(values, factor):
    """Multiply every value by the given factor.

    Returns a new list.
    """
    out = [v * factor for v in values]
    return out
'''


def test_task_examples_of_the_pretraining_files(stdlib, site):
  """Both tasks' examples of the pretraining files' functions (the extra
  distillation inputs of tools/default_models/build.py), minus excluded
  inputs."""
  write(site, "pkg_b/util.py", SCALE + "# padding\n" * 60)
  c = corpus.build(stdlib)
  pre = pretraining.build(c, site)
  t5 = {e["inputs"]: e["targets"]
        for e in pretraining.task_examples(pre, "t5_docstring")}
  scale_src = ("def scale(values, factor):\n"
               "    out = [v * factor for v in values]\n    return out")
  assert t5[scale_src] == "Multiply every value by the given factor."
  assert pretraining.docstring_examples(pre) == pretraining.task_examples(
      pre, "t5_docstring")
  gemma = {e["inputs"]: e["targets"]
           for e in pretraining.task_examples(pre, "gemma_completion")}
  prompt = [p for p in gemma if p.startswith("def scale(")]
  assert len(prompt) == 1
  assert "Multiply every value" in prompt[0]
  assert gemma[prompt[0]] == scale_src.split(":\n", 1)[1]
  # The stdlib training file's function is there too; excluded inputs not.
  assert any(p.startswith("def area(") for p in gemma)
  left = pretraining.task_examples(pre, "gemma_completion",
                                   exclude=frozenset(prompt))
  assert len(left) == len(gemma) - 1
  assert not any(e["inputs"].startswith("def scale(") for e in left)
  with pytest.raises(ValueError, match="task must be one of"):
    pretraining.task_examples(pre, "t5_summaries")
