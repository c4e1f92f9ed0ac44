"""Bad input gives clear errors; knob changes never recompile."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax import struct

from specdec_jax import decoding, models, sharding
from specdec_jax.decoding import inputs
from specdec_jax.decoding.loops import program
from specdec_jax.decoding.loops.state import Batch, LoopConfig, Request
from specdec_jax.decoding.rules.knobs import Static
from tests.decoding.pairs import tiny_pair


@pytest.fixture(scope="module")
def pair():
  return tiny_pair("gemma")


def _gen(pair, method=None, prompts=([2, 5, 6],), **kw):
  d, v, qp, pp = pair
  return decoding.generate(method or decoding.make_method("spec_decode"), d, v,
                           qp, pp, [list(p) for p in prompts], **kw)


@pytest.mark.parametrize("kw,match", [
    (dict(gamma=0), "gamma must be an integer >= 1, got 0"),
    (dict(gamma=2.5), "gamma must be an integer >= 1"),
    (dict(sampling=decoding.Temperature(-0.5)),
     r"temperature must be a finite number >= 0"),
    (dict(sampling=decoding.TopP(0.0)), r"top_p must be in \(0, 1\]"),
    (dict(sampling=decoding.TopP(1.5)), r"top_p must be in \(0, 1\]"),
    (dict(sampling=decoding.TopK(0)), "top_k must be an integer >= 1"),
    (dict(max_new_tokens=-1), "max_new_tokens must be integers >= 0"),
    (dict(max_new_tokens=40, max_cache_length=32),
     "cache slots exceed max_cache_length"),
    (dict(prompts=([],)), "prompt of row 0 is empty"),
    (dict(prompts=([2, 999],)), r"prompts contain id 999 .* vocabulary"),
    (dict(sampling="greedy"), "sampling must be a strategy"),
    (dict(seeds=[1, 2]), "broadcast"),
])
def test_bad_arguments(pair, kw, match):
  with pytest.raises(ValueError, match=match):
    _gen(pair, **kw)


@pytest.mark.parametrize("name,knobs,match", [
    ("lossy", dict(alpha=1.0), r"Lossy alpha must be in \[0.0, 1.0\)"),
    ("lossy", dict(alpha=-0.1), r"Lossy alpha must be in"),
    ("lossy", dict(alpha=0.2, beta=0.5), r"beta must be >= 1 - alpha"),
    ("chow", dict(alpha=1.5), r"Chow alpha must be in \[0.0, 1.0\]"),
    ("opt", dict(alpha=-1.0), "OPT alpha must be in"),
    ("token_v3", dict(alpha=2.0), "TokenV3 alpha must be in"),
    ("bild", dict(alpha_fallback=1.5), "alpha_fallback must be in"),
    ("seq_cascade", dict(alpha=float("nan")), "SeqCascade alpha"),
])
def test_bad_knobs(pair, name, knobs, match):
  with pytest.raises(ValueError, match=match):
    _gen(pair, decoding.make_method(name, **knobs))


def test_unknown_method_and_knob():
  with pytest.raises(ValueError, match="unknown method 'fast'"):
    decoding.make_method("fast")
  with pytest.raises(ValueError, match="bad knobs .* 'chow'"):
    decoding.make_method("chow", gamma=3)


def test_greedy_only_methods_reject_sampling(pair):
  with pytest.raises(ValueError, match="LossyGreedy is a greedy method"):
    _gen(pair, decoding.make_method("lossy_greedy", alpha=0.3),
         sampling=decoding.Temperature(1.0))
  with pytest.raises(ValueError, match="BiLD is a greedy method"):
    _gen(pair, decoding.make_method("bild"), sampling=decoding.TopP(0.9))


def test_vocabulary_mismatch():
  d = models.get_model("gemma_tiny", vocab_size=80)
  v = models.get_model("gemma_tiny")
  with pytest.raises(ValueError, match=r"vocabularies differ \(80 vs 64"):
    decoding.generate(decoding.make_method("spec_decode"), d, v, None, None,
                      [[2]])


def test_encoder_decoder_input_errors():
  d, v, qp, pp = tiny_pair("t5")
  with pytest.raises(ValueError, match="need inputs="):
    decoding.generate(decoding.make_method("spec_decode"), d, v, qp, pp,
                      [[0]])
  g = tiny_pair("gemma")
  with pytest.raises(ValueError, match="decoder-only models take no inputs"):
    decoding.generate(decoding.make_method("spec_decode"), g[0], g[1], g[2],
                      g[3], [[2]], inputs=[[3]])
  with pytest.raises(ValueError, match="both be encoder-decoder"):
    decoding.generate(decoding.make_method("spec_decode"), g[0], v, g[2], pp,
                      None, inputs=[[3]])


def test_nonfinite_logits_raise_or_are_flagged(pair):
  d, v, qp, pp = pair
  bad = jax.tree.map(lambda x: x, pp)
  bad["final_norm"]["scale"] = bad["final_norm"]["scale"].at[0].set(jnp.nan)
  with pytest.raises(FloatingPointError, match="non-finite logits .* rows"):
    decoding.generate(decoding.make_method("spec_decode"), d, v, qp, bad,
                      [[2, 3], [4]], max_new_tokens=4)
  out = decoding.generate(decoding.make_method("spec_decode"), d, v, qp, bad,
                          [[2, 3], [4]], max_new_tokens=4,
                          on_nonfinite="return")
  assert not out.finite.any()
  out = decoding.generate(decoding.TargetOnly(), d, v, qp, pp, [[2, 3]],
                          max_new_tokens=4)
  assert out.finite.all()


def test_knobs_prompts_and_seeds_do_not_recompile(pair):
  d, v, qp, pp = pair
  run = lambda prompts, alpha, beta, temp, seed: decoding.generate(
      decoding.make_method("lossy", alpha=alpha, beta=beta), d, v, qp, pp,
      prompts, sampling=decoding.TopP(0.9, temperature=temp), gamma=3,
      max_new_tokens=8, seeds=seed)
  run([[2, 3, 4], [5]], 0.1, 1.0, 1.0, 0)
  cfg = LoopConfig(topology=decoding.Topology.chain(3), max_new=8,
                   eos_id=v.eos_id,
                   sampling=inputs.sampling_static(decoding.TopP(0.9)))
  key = decoding.make_method("lossy").program((d, v), cfg).key
  before = program.compile_count(key)
  assert before >= 1
  run([[7, 8], [9, 10, 11, 12]], 0.5, 0.9, 0.3, 12)
  run([[2]] * 2, np.float64(0.3), 2, 0, np.int64(4))
  run([[2, 9], [4]], [0.2, 0.4], [1.0, 1.5], [0.0, 1.0], [1, 2])
  assert program.compile_count(key) == before
  # Switching to a different method does compile a new program (its own
  # key: the rule's class is part of it).
  opt = decoding.make_method("opt", alpha=0.3)
  decoding.generate(opt, d, v, qp, pp, [[2, 3], [4]], gamma=3,
                    max_new_tokens=8, sampling=decoding.TopP(0.9))
  assert program.compile_count(opt.program((d, v), cfg).key) == 1
  assert program.compile_count(key) == before
  # Greedy() and Temperature(0) are one program.
  greedy = [decoding.generate(decoding.make_method("spec_decode"), d, v, qp,
                              pp, [[2, 3]], gamma=3, max_new_tokens=8,
                              sampling=s).sequences()
            for s in (decoding.Greedy(), decoding.Temperature(0.0))]
  assert greedy[0] == greedy[1]
  g_cfg = LoopConfig(topology=decoding.Topology.chain(3), max_new=8,
                     eos_id=v.eos_id,
                     sampling=inputs.sampling_static(decoding.Greedy()))
  g_key = decoding.make_method("spec_decode").program((d, v), g_cfg).key
  assert program.compile_count(g_key) == 1


def test_seq_cascade_compiles_once_and_defers_per_row(pair):
  """SeqCascade called eagerly reuses its compiled programs.

  (Regression: an eager lax.cond closed over the parameters and the batch as
  constants, compiling a new program -- with a copy of the weights -- on
  every call, until a long sweep ran out of memory.)
  """
  d, v, qp, pp = pair
  compiles = []
  jax.monitoring.register_event_duration_secs_listener(
      lambda event, secs, **kw: compiles.append(event)
      if event == "/jax/core/compile/backend_compile_duration" else None)
  run = lambda prompts, alpha: decoding.generate(
      decoding.make_method("seq_cascade", alpha=alpha), d, v, qp, pp,
      prompts, gamma=3, max_new_tokens=8)
  run([[2, 3, 4], [5]], [0.0, 1.0])  # warm: row 0 defers, row 1 does not
  compiles.clear()
  out = run([[7, 8], [9, 10, 11]], [0.0, 1.0])
  again = run([[2, 9], [4]], [1.0, 0.0])
  assert compiles == []
  # alpha 0 defers whatever the confidence; alpha 1 never does.
  assert out.deferrals[0] == out.lengths[0] and out.deferrals[1] == 0
  assert again.deferrals[0] == 0 and again.deferrals[1] == again.lengths[1]
  assert out.verifier_calls[1] == 0 and out.verifier_calls[0] > 0


def _same_shaped_classes(n):
  """``n`` flax dataclasses with identical fields; ``value`` adds the index."""
  def make(i):
    @struct.dataclass
    class Knob:
      x: jax.Array  # [B]

      def value(self):
        return self.x + i
    Knob.__name__ = Knob.__qualname__ = f"Knob{i}"
    return Knob
  return [make(i) for i in range(n)]


@struct.dataclass
class _DoneState:
  done: jax.Array  # [B] bool


@pytest.mark.parametrize("use_mesh", [False, True])
def test_same_shaped_method_classes_never_share_a_program(use_mesh):
  """Regression: jax's PyTreeDef equality ignores dataclass node classes.

  ``TokenV2(alpha=a)`` and ``TokenV3(alpha=a)`` have equal tree structures
  but different hashes; when rule objects travelled inside the jitted
  arguments, one ``jax.jit`` called with both could run one class's
  executable for the other (CI saw TokenV3 return TokenV2's tokens). Now
  only plain knob dicts cross the jit boundary and the rule's class is in
  the program key: 64 same-shaped classes give 64 programs, each its own.
  """
  classes = _same_shaped_classes(64)
  z = jnp.zeros((1,), jnp.int32)
  batch = Batch(prompt=jnp.zeros((1, 1), jnp.int32), prompt_len=z + 1,
                inputs=None, req=Request(seed=z, request_id=z,
                                         max_new_tokens=z),
                sampling={}, knobs={"x": z})
  mesh = sharding.make_mesh() if use_mesh else None

  def prog(cls):
    rule = Static(cls)
    return program.LoopProgram(
        ("same-shaped-classes", use_mesh, rule),
        init=lambda a: _DoneState(done=a[1].prompt[:, 0] >= 0),
        cond=lambda a, s: False, body=lambda a, s: s,
        finish=lambda a, s: rule.bind(a[1].knobs).value())

  got = [int(program.run_program(prog(cls), ((), batch), mesh)[0])
         for cls in classes]
  assert got == list(range(64))


def test_token_v1_v2_v3_in_one_process_each_run_their_own_rule(pair):
  """Same knobs and program key: each method's output is its own.

  Each method alone (compiled caches cleared first) is the reference; then
  all three run back to back through the shared program key.
  """
  d, v, qp, pp = pair
  names = ("token_v1", "token_v2", "token_v3")

  def run(name):
    out = decoding.generate(
        decoding.make_method(name, alpha=0.01), d, v, qp, pp,
        [[2, 5, 6], [4, 9]], sampling=decoding.Temperature(1.0), gamma=3,
        max_new_tokens=8, seeds=[1, 2])
    return out.sequences(), out.accepted.tolist(), out.deferrals.tolist()

  alone = {}
  for name in names:
    program.clear_compiled()
    alone[name] = run(name)
  assert len({repr(r) for r in alone.values()}) == 3  # the rules differ here
  for name in names + names[::-1]:
    assert run(name) == alone[name], name
