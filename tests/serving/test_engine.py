"""The slot engine: tokens equal offline decoding, whatever shares a pool
and whenever a request joins; no recompiles as requests come and go."""

import pytest

from specdec_jax.serving import EngineRequest, Speculation, parse_speculation
from tests.serving import common


def test_parse_speculation():
  assert parse_speculation("off") == Speculation("off")
  assert parse_speculation("chain:3") == Speculation("chain", gamma=3)
  assert parse_speculation("chain").gamma == 4
  assert parse_speculation("tree:2,3").kary == (2, 3)
  assert parse_speculation("hierarchy:2,4", depth=3).buffers == (2, 4)
  assert str(parse_speculation("TREE:3,2")) == "tree:3,2"
  for bad, msg in [("auto", "not available"), ("beam", "not one of"),
                   ("chain:0", ">= 1"), ("tree:2", "K,D"),
                   ("hierarchy:2", "needs 2 buffers"), (3, "string"),
                   ("tree:9,9", "too many")]:
    with pytest.raises(ValueError, match=msg):
      parse_speculation(bad, depth=3)


@pytest.mark.parametrize("specs,temps,methods", [
    (("chain:3", "off"), (0.0,), ("spec_decode",)),
    (("tree:2,2", "hierarchy:2,4"), (1.0,), ("spec_decode",)),
    (("chain:2",), (1.0,), ("token_v3",)),
], ids=["chain_off_greedy", "tree_hierarchy_T1", "token_v3_T1"])
def test_tokens_equal_offline(specs, temps, methods):
  eng = common.engine()
  reqs = common.requests(6, seed=len(specs) + len(methods[0]), specs=specs,
                         temps=temps, methods=methods)
  got = common.drive(eng, reqs)
  assert got == common.offline(reqs)
  # One init, insert and generate executable per pool, however many
  # requests came and went.
  assert set(eng.compile_counts().values()) == {1}


def test_t5_encoder_decoder_tokens_equal_offline():
  eng = common.engine("t5")
  reqs = common.requests(3, seed=9, specs=("chain:2",), temps=(1.0,))
  assert common.drive(eng, reqs) == common.offline(reqs, family="t5")


def test_power_of_two_sub_batch_and_bad_requests():
  eng = common.engine(slots=4, gather=True)
  reqs = common.requests(5, seed=3, specs=("chain:2",), temps=(0.0,))
  got = common.drive(eng, reqs)
  assert got == common.offline(reqs)
  sizes = {k[1][1] for k in eng.compile_counts() if k[1][0] == "generate"}
  assert sizes <= {1, 2, 4} and len(sizes) >= 2
  base = dict(prompt=(3, 4), max_tokens=4, speculation=Speculation("chain"))
  for change, msg in [({"prompt": ()}, "empty"),
                      ({"prompt": (3, 99)}, "outside the vocabulary"),
                      ({"prompt": (3,) * 17}, "shorten"),
                      ({"max_tokens": 0}, ">= 1"),
                      ({"max_tokens": 13}, "slot length"),
                      ({"method": "nope"}, "unknown method"),
                      ({"method": "seq_cascade"}, "not served"),
                      ({"method": "lossy_greedy", "temperature": 1.0},
                       "greedy-only"),
                      ({"method": "token_v3", "knobs": (("alpha", 2.0),)},
                       "alpha"),
                      ({"temperature": -1.0}, "temperature"),
                      ({"seed": -1}, "seed")]:
    with pytest.raises(ValueError, match=msg):
      eng.prefill(EngineRequest(**{**base, **change}))


def test_pool_rows_take_their_own_knobs():
  """Requests sharing one pool (same strategy key) keep their OWN traced
  knobs: the pool was created by a T=1 / alpha=0.9 request, and a later
  greedy / alpha=0.1 request must still decode as it would alone (the
  pool's recipe must not lend its creator's temperature or alpha)."""
  eng = common.engine()
  spec = Speculation("chain", gamma=3)
  reqs = [
      EngineRequest(prompt=(2, 7, 9), max_tokens=6, speculation=spec,
                    method="token_v3", knobs=(("alpha", 0.9),),
                    temperature=1.0, seed=5),
      EngineRequest(prompt=(2, 5, 6), max_tokens=6, speculation=spec,
                    method="token_v3", knobs=(("alpha", 0.1),),
                    temperature=0.7, seed=1),
      EngineRequest(prompt=(2, 4), max_tokens=6, speculation=spec,
                    method="spec_decode", temperature=1.0, seed=3),
      EngineRequest(prompt=(2, 5, 6), max_tokens=6, speculation=spec,
                    method="spec_decode", temperature=0.0, seed=3),
  ]
  assert common.drive(eng, reqs) == common.offline(reqs)
