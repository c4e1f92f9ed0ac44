"""The shipped default pairs: loading, tokenizers, examples, decoding."""

import functools
import os
import re

import numpy as np
import pytest

from specdec_jax import decoding
from specdec_jax.families import corpus as corpus_lib
from specdec_jax.families import loader as dm

BUILT = all(
    os.path.isfile(os.path.join(dm.ASSETS, name, role, "params.safetensors"))
    for name in dm.PAIRS for role in ("drafter", "verifier")) and \
    os.path.isfile(os.path.join(dm.ASSETS, dm.METADATA))
needs_assets = pytest.mark.skipif(
    not BUILT, reason="default model assets are not built yet: run "
    "python -m tools.default_models.build (docs/default_models.md)")


@functools.lru_cache(maxsize=None)
def pair(name):
  return dm.load(name)


def test_unknown_names_and_options_are_rejected():
  with pytest.raises(ValueError, match="unknown default pair 'nope'; "
                     "available: t5_codegen, gemma_completion"):
    dm.load("nope")
  with pytest.raises(ValueError, match="dtype must be 'float32' or "
                     "'bfloat16', got 'int8'"):
    dm.load("t5_codegen", dtype="int8")
  with pytest.raises(ValueError, match="split must be one of"):
    dm.examples("t5_codegen", "dev")
  with pytest.raises(ValueError, match="limit must be >= 0"):
    dm.examples("t5_codegen", "test", limit=-1)


def test_missing_assets_say_how_to_build_them(tmp_path):
  with pytest.raises(ValueError, match=r"not built .*"
                     r"tools/default_models/build\.py"):
    dm.load("gemma_completion", assets=str(tmp_path))
  with pytest.raises(ValueError, match="default_models/build.py"):
    dm.metadata(str(tmp_path))


@needs_assets
def test_damaged_asset_copies_are_errors_naming_the_file(tmp_path):
  """Issue 43: a copy missing medium/config.json loaded as 2 levels; a
  truncated metadata.json gave a JSONDecodeError naming no file."""
  import shutil  # pylint: disable=g-import-not-at-top
  src = os.path.join(dm.ASSETS, "gemma_completion")
  dst = tmp_path / "gemma_completion"
  shutil.copytree(src, dst)
  meta = open(os.path.join(dm.ASSETS, dm.METADATA), encoding="utf-8").read()
  (tmp_path / dm.METADATA).write_text(meta[:len(meta) // 2])
  with pytest.raises(ValueError, match=(
      f"{tmp_path}/metadata.json is not valid JSON .*; the file is truncated "
      f"or corrupt")):
    dm.metadata(str(tmp_path))
  (tmp_path / dm.METADATA).write_text(meta)
  os.remove(dst / "medium" / "config.json")
  with pytest.raises(ValueError, match=(
      f"the default pair 'gemma_completion' has an incomplete medium model "
      f"\\({dst}/medium/config.json is missing\\); restore it from the "
      f"package, or delete {dst}/medium to use the 2-level pair")):
    dm.load("gemma_completion", assets=str(tmp_path))
  shutil.rmtree(dst / "medium")  # a 2-level copy is legitimate
  assert len(dm.load("gemma_completion", assets=str(tmp_path)).levels()) == 2


def test_examples_are_deterministic_and_split_by_file():
  first = dm.examples("t5_codegen", "test", limit=5)
  assert first == dm.examples("t5_codegen", "test", limit=5)
  assert len(first) == 5
  assert set(first[0]) == {"id", "inputs", "targets"}
  test = dm.examples("gemma_completion", "test")
  train = dm.examples("gemma_completion", "train")
  assert len(test) > 300 and len(train) > 10 * len(test) / 2
  test_files = {e["id"].split(":")[0] for e in test}
  train_files = {e["id"].split(":")[0] for e in train}
  assert not test_files & train_files
  assert len({e["id"] for e in train}) == len(train)
  # Gemma prompts end with the docstring line; targets are body lines.
  assert all(e["inputs"].endswith("\n") for e in test)
  assert all(e["targets"] and not e["targets"].endswith("\n") for e in test)
  # The benchmark aliases name the same tasks.
  assert dm.examples("default-t5", "test", limit=5) == first


@needs_assets
def test_metadata_matches_this_corpus_when_the_stdlib_is_the_same():
  meta = dm.metadata()
  corpus = corpus_lib.default_corpus()
  assert re.fullmatch(r"[0-9a-f]{64}", meta["corpus"]["corpus_hash"])
  assert len(meta["corpus"]["files"]) == meta["corpus"]["stats"][
      "files_listed"]
  if corpus.corpus_hash != meta["corpus"]["corpus_hash"]:
    pytest.skip("this Python's stdlib differs from the one the assets were "
                "built from")
  assert list(corpus.files) == meta["corpus"]["files"]
  for task in dm.PAIRS:
    assert corpus.examples_hash(task) == meta["corpus"]["examples_hash"][
        task]


@needs_assets
@pytest.mark.parametrize("name", dm.PAIRS)
def test_shipped_pair_loads_with_matching_vocabulary(name):
  p = pair(name)
  assert p.name == name and p.metrics == dm.TASKS[name].metrics
  assert p.tokenizer.vocab_size == p.drafter.vocab_size == \
      p.verifier.vocab_size
  assert p.is_encoder_decoder == (name == "t5_codegen")
  p.drafter.check_params(p.q_params)
  p.verifier.check_params(p.p_params)
  assert p.verifier.num_params() > 10 * p.drafter.num_params()
  ev = p.info["evaluation"]
  for level in dm.LEVELS:
    assert ev["cost"][level]["params"] == p.model(level)[0].num_params()
    for metric in p.metrics:
      assert 0.0 <= ev["levels"][level][metric] <= 100.0
  # The verifier models held-out text better than its drafter (the full
  # family checks: tests/eval/test_default_families.py).
  assert ev["levels"]["large"]["validation_loss"] < \
      ev["levels"]["small"]["validation_loss"]
  assert 0.0 < ev["acceptance"]["small>large"] < ev["alpha"]["small>large"] \
      < 1.0
  assert ev["spec_equals_target"]["small>large"] == 1.0
  # Round trip of a real example through the shipped tokenizer.
  ex = dm.examples(name, "test", limit=1)[0]
  ids = p.tokenizer.encode(ex["inputs"], add_bos=False)
  assert p.tokenizer.decode(ids) == ex["inputs"]


@needs_assets
def test_encode_and_decode_follow_the_family_conventions():
  t5, gemma = pair("t5_codegen"), pair("gemma_completion")
  exs = dm.examples("t5_codegen", "test", limit=3)
  rows = t5.encode(exs)["inputs"]
  assert [r[-1] for r in rows] == [t5.tokenizer.eos_id] * 3
  assert rows[0][:-1] == t5.tokenizer.encode(exs[0]["inputs"])[:319]
  exs = dm.examples("gemma_completion", "test", limit=3)
  got = gemma.encode(exs)
  assert set(got) == {"prompts"}
  assert [r[0] for r in got["prompts"]] == [gemma.tokenizer.bos_id] * 3
  tok = gemma.tokenizer
  text = "    return x"
  ids = tok.encode(text, add_bos=False)
  assert gemma.decode([ids + [tok.eos_id] + ids, ids + [0, 0]]) == [text,
                                                                     text]


@needs_assets
@pytest.mark.parametrize("name", dm.PAIRS)
def test_greedy_decoding_produces_text(name):
  p = pair(name)
  exs = dm.examples(name, "test", limit=4)
  texts, out = p.generate(decoding.make_method("target_only"), exs,
                          max_new_tokens=24)
  assert len(texts) == 4 and all(t.strip() for t in texts)
  assert out.tokens.shape == (4, 24)
  assert np.all(out.lengths >= 1)


@needs_assets
@pytest.mark.slow
def test_spec_decode_is_greedy_exact_on_the_shipped_pair():
  p = pair("gemma_completion")
  exs = dm.examples("gemma_completion", "test", limit=4)
  want, _ = p.generate(decoding.make_method("target_only"), exs,
                       max_new_tokens=24)
  got, out = p.generate(decoding.make_method("spec_decode"), exs,
                        max_new_tokens=24, gamma=5)
  assert got == want
  assert 0.0 < out.acceptance_rate <= 1.0


@needs_assets
def test_benchmark_loader_returns_the_four_tuple_with_examples():
  bench = dm.load_pair_for_benchmark("default-gemma", limit=3)
  drafter, verifier, q, p = bench
  assert drafter.vocab_size == verifier.vocab_size
  assert q is bench.pair.q_params and p is bench.pair.p_params
  assert len(bench.prompts) == 3 and bench.inputs is None
  assert all(r[0] == bench.pair.tokenizer.bos_id for r in bench.prompts)
  bench = dm.load_pair_for_benchmark("default-t5", limit=2)
  assert bench.prompts is None and len(bench.inputs) == 2
