"""The host side of a decode call: remembered parameter checks, one
transfer in, plain copies out (issue 39 item 2: fixed seconds per call)."""

import jax
import numpy as np
import pytest

from specdec_jax import decoding, models
from specdec_jax.decoding import inputs as inputs_lib
from specdec_jax.decoding import transfer
from specdec_jax.decoding.rules import knobs as knobs_lib
from specdec_jax.models import base as base_lib
from specdec_jax.models import params as params_lib
from tests.decoding.pairs import random_prompts, tiny_pair
from tests.models.helpers import tiny


def test_a_checked_tree_is_remembered_and_a_changed_one_checked_again(
    monkeypatch):
  model, params = tiny("gemma")
  calls = []
  real = base_lib.check_params
  monkeypatch.setattr(base_lib, "check_params",
                      lambda *a, **k: calls.append(1) or real(*a, **k))
  base_lib._CHECKED.clear()
  model.check_params(params)
  model.check_params(params)
  model.check_params(jax.tree.map(np.asarray, params))  # same shapes
  assert len(calls) == 1
  # A leaf replaced in place by one of another shape: a new signature, so
  # the full check runs and names the leaf.
  params["final_norm"]["scale"] = np.zeros(31, np.float32)
  with pytest.raises(ValueError, match=r"'final_norm/scale' has shape "
                     r"\(31,\), expected \(32,\)"):
    model.check_params(params)
  # Another model object (another architecture) is checked on its own.
  other, _ = tiny("t5")
  good = models.flatten_params(tiny("gemma")[1])
  with pytest.raises(ValueError, match="missing"):
    other.check_params(models.unflatten_params(good))


def test_shape_signature_reads_structure_and_shapes_only():
  _, params = tiny("gemma")
  sig = params_lib.shape_signature(params)
  assert sig == params_lib.shape_signature(jax.tree.map(np.zeros_like,
                                                        params))
  wider = jax.tree.map(lambda x: x, params)
  wider["final_norm"]["scale"] = np.zeros(33, np.float32)
  assert params_lib.shape_signature(wider) != sig
  assert params_lib.shape_signature({"a": [1.0, 2.0]}) is None  # no shape


def test_call_signature_keys_on_structure_and_abstract_values():
  sig = transfer.signature({"a": np.zeros((2, 3), np.float32), "b": 1})
  assert sig == transfer.signature({"a": np.ones((2, 3), np.float32),
                                    "b": 5})
  assert sig != transfer.signature({"a": np.zeros((2, 4), np.float32),
                                    "b": 1})
  assert sig != transfer.signature({"a": np.zeros((2, 3), np.int32),
                                    "b": 1})
  assert sig != transfer.signature({"c": np.zeros((2, 3), np.float32),
                                    "b": 1})


def test_knobs_are_host_arrays_and_a_batch_moves_in_one_put(monkeypatch):
  knobs = knobs_lib.per_row({"temperature": 0.5, "k": [3, 4]}, 2, "x")
  assert all(isinstance(v, np.ndarray) for v in knobs.values())
  assert knobs["temperature"].dtype == np.float32
  assert knobs["k"].dtype == np.int32
  puts = []
  real = jax.device_put
  monkeypatch.setattr(inputs_lib.jax, "device_put",
                      lambda x, *a, **k: puts.append(1) or real(x, *a, **k))
  _, v, _, _ = tiny_pair("gemma")
  batch, rows, max_new, width = inputs_lib.prepare_batch(
      decoding.TargetOnly(), v, decoding.Temperature(0.5),
      prompts=[[2, 5, 6], [2, 7]], inputs=None, max_new_tokens=[3, 4],
      seeds=[1, 2], request_ids=None, pad_to=None, mesh=None)
  assert len(puts) == 1
  leaves = jax.tree.leaves(batch)
  assert all(isinstance(x, jax.Array) for x in leaves)
  assert batch.prompt.dtype == np.int32
  np.testing.assert_array_equal(  # right-padded with 0, lengths kept
      batch.prompt, np.pad([[2, 5, 6], [2, 7, 0]], ((0, 0), (0, width - 3))))
  np.testing.assert_array_equal(batch.prompt_len, [3, 2])
  np.testing.assert_array_equal(batch.req.seed, [1, 2])
  np.testing.assert_array_equal(batch.req.max_new_tokens, [3, 4])
  np.testing.assert_array_equal(batch.sampling["temperature"], [0.5, 0.5])
  assert (rows, max_new) == (2, 4)
  # JAX values (the t5x adapter's, built inside jit) are kept as they are.
  ids = jax.numpy.arange(3, dtype=np.int32)
  kept = transfer.to_device({"a": ids, "b": np.ones(2, np.float32)})
  assert kept["a"] is ids and isinstance(kept["b"], jax.Array)


def test_results_come_back_as_host_numpy_rows():
  d, v, qp, pp = tiny_pair("gemma")
  prompts = random_prompts(np.random.default_rng(3), 3, v.vocab_size, 2, 6)
  res = decoding.generate(decoding.make_method("spec_decode"), d, v, qp, pp,
                          prompts, gamma=3, max_new_tokens=7, seeds=4,
                          eos_id=None)
  x = jax.numpy.arange(6).reshape(2, 3)
  got = transfer.gather(x)
  assert isinstance(got, np.ndarray)
  np.testing.assert_array_equal(got, [[0, 1, 2], [3, 4, 5]])
  for f in ("tokens", "lengths", "calls", "finite"):
    assert isinstance(getattr(res, f), np.ndarray), f
    assert getattr(res, f).shape[0] == 3, f
  assert (res.lengths == 7).all()


def test_numpy_params_warn_that_every_call_copies_them():
  d, v, qp, pp = tiny_pair("gemma")
  prompts = [[2, 5, 6]]
  with pytest.warns(UserWarning, match=r"the verifier's params hold \d+ "
                    r"numpy arrays .*every decode call copies them to the "
                    r"device again; .*jax.device_put\(params\)"):
    decoding.generate(decoding.TargetOnly(), d, v, qp,
                      jax.tree.map(np.asarray, pp), prompts,
                      max_new_tokens=2)
  import warnings  # pylint: disable=g-import-not-at-top
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # device params: no warning
    decoding.generate(decoding.TargetOnly(), d, v, qp,
                      jax.device_put(pp), prompts, max_new_tokens=2)


def test_native_checkpoints_load_as_device_arrays(tmp_path):
  from specdec_jax.checkpoints import native  # pylint: disable=g-import-not-at-top
  model, params = tiny("gemma")
  native.save(str(tmp_path), model, jax.tree.map(np.asarray, params))
  _, loaded = native.load(str(tmp_path))
  assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(loaded))
  np.testing.assert_array_equal(loaded["final_norm"]["scale"],
                                params["final_norm"]["scale"])
