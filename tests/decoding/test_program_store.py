"""The program store: a warm run skips tracing and returns the same tokens."""

import dataclasses
import os

import jax
import numpy as np
import pytest

from specdec_jax import decoding, program_cache
from specdec_jax.decoding.loops import exported
from tests.decoding.pairs import tiny_pair

PROMPTS = [[2, 5, 7], [2, 9]]


def _tokens(method, d, v, qp, pp, **kw):
  where = "inputs" if v.is_encoder_decoder else "prompts"
  out = decoding.generate(method, d, v, qp, pp, gamma=3, max_new_tokens=6,
                          seeds=[3, 4], **{where: PROMPTS}, **kw)
  return out.tokens, out.lengths, out.accepted, out.deferrals


@pytest.fixture
def store(tmp_path):
  program_cache.enable(str(tmp_path))
  exported.clear()
  yield tmp_path
  program_cache.enable(None)
  exported.clear()


def _entries(path, kind="program"):
  return sorted(p for p in os.listdir(path) if p.startswith(kind + "-"))


def test_warm_run_skips_tracing_and_returns_the_cold_tokens(store,
                                                           monkeypatch):
  d, v, qp, pp = tiny_pair("t5")
  method = decoding.make_method("token_v3", alpha=0.3)
  sampling = decoding.Temperature(0.7)
  program_cache.enable(None)
  plain = _tokens(method, d, v, qp, pp, sampling=sampling)  # plain jit
  program_cache.enable(str(store))
  cold = _tokens(method, d, v, qp, pp, sampling=sampling)  # exports, stores
  assert len(_entries(store)) == 1
  exported.clear()  # as a new process: nothing in memory

  def no_trace(*args, **kwargs):
    raise AssertionError("a warm run traced the program again")
  monkeypatch.setattr(exported, "_export", no_trace)
  warm = _tokens(method, d, v, qp, pp, sampling=sampling)
  for a, b, c in zip(plain, cold, warm):
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, c)


def test_changed_model_or_source_never_reuses_a_stale_program(store,
                                                             monkeypatch):
  d, v, qp, pp = tiny_pair("gemma")
  method = decoding.make_method("spec_decode")
  _tokens(method, d, v, qp, pp)
  first = _entries(store)
  # Another config, same parameter shapes: its own program and its tokens.
  v2 = dataclasses.replace(v, config=dataclasses.replace(v.config, eos_id=7))
  program_cache.enable(None)
  plain = _tokens(method, v2, v2, qp, pp)
  program_cache.enable(str(store))
  got = _tokens(method, v2, v2, qp, pp)
  assert len(_entries(store)) == 2 and set(first) < set(_entries(store))
  for a, b in zip(plain, got):
    np.testing.assert_array_equal(a, b)
  # An edited source file (or another JAX): another fingerprint, another file.
  before = program_cache.entry_path("program", "k", "bin")
  monkeypatch.setattr(program_cache, "source_hash", lambda: "edited")
  assert program_cache.entry_path("program", "k", "bin") != before


def test_corrupt_entries_are_recomputed(store):
  d, v, qp, pp = tiny_pair("t5")
  method = decoding.make_method("spec_decode")
  want = _tokens(method, d, v, qp, pp)
  for name in _entries(store) + _entries(store, "param_shapes"):
    with open(os.path.join(store, name), "wb") as f:
      f.write(b"\x00garbage")
  exported.clear()
  got = _tokens(method, d, v, qp, pp)
  for a, b in zip(want, got):
    np.testing.assert_array_equal(a, b)


def test_param_shapes_memo_matches_the_traced_shapes(store):
  _, v, _, _ = tiny_pair("gemma")
  traced = v.param_shapes_traced()
  assert v.param_shapes() == traced  # computed, stored
  assert _entries(store, "param_shapes")
  assert v.param_shapes() == traced  # read back


def test_describe_and_rebuild_round_trip():
  desc = exported.describe({"a": (jax.numpy.ones(1), None,
                                  [jax.numpy.zeros(2)])})
  assert desc == {"dict": {"a": {"tuple": ["*", None, {"list": ["*"]}]}}}
  assert exported.rebuild(desc, iter([1, 2])) == {"a": (1, None, [2])}
  with pytest.raises(exported.Unsupported):
    exported.describe({1: jax.numpy.zeros(1)})
  with pytest.raises(exported.Unsupported):
    exported.describe(object())


def test_store_is_off_unless_enabled():
  assert program_cache.directory() is None
  assert program_cache.memo("k", "x", lambda: 3) == 3
  assert program_cache.entry_path("k", "x", "json") is None
  assert exported.run(None, None) is None
