"""Harness: configs, grids, JSONL rows, warm-up, and resuming after a kill.

The stand-in pair (:func:`stand_in_pair`) is a DefaultPair-like object over
the tiny random T5 / Gemma pairs of tests/decoding/pairs.py with a tiny
SentencePiece tokenizer trained here; :func:`three_levels` adds a medium
level (the verifier's first layer, ``models.early_exit``) and ``levels()``
for hierarchies. test_main_job.py reuses them.
"""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from specdec_jax import decoding, models
from specdec_jax import tokenizer as tokenizer_lib
from specdec_jax.decoding.hierarchy.api import generate_hierarchy
from specdec_jax.eval import drafts, harness
from tests.decoding.pairs import tiny_pair

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))

WORDS = ("the cat sat on a mat while dogs ran in parks and birds sang "
         "over green hills near old towns").split()


def corpus(n: int, seed: int = 0) -> list[str]:
  rng = np.random.default_rng(seed)
  return [" ".join(rng.choice(WORDS, size=int(rng.integers(3, 9))))
          for _ in range(n)]


def train_tokenizer(family: str, path: str | None = None):
  """A tiny tokenizer whose ids fit the tiny models' 64-id vocabulary."""
  return tokenizer_lib.train(corpus(400, seed=1), vocab_size=48,
                             family=family, path=path, extra_ids=0,
                             byte_fallback=False, num_threads=1)


@dataclasses.dataclass
class StandInPair:
  """The subset of default_models.DefaultPair the eval code uses."""

  name: str
  drafter: object
  verifier: object
  q_params: object
  p_params: object
  tokenizer: tokenizer_lib.Tokenizer
  metrics: tuple = ("rouge2", "bleu")
  max_new_tokens: int = 12
  is_encoder_decoder: bool = True

  def encode(self, examples):
    if self.is_encoder_decoder:
      return {"inputs": [self.tokenizer.encode(ex["inputs"], add_eos=True)
                         for ex in examples]}
    return {"prompts": [self.tokenizer.encode(ex["inputs"])
                        for ex in examples]}

  def decode(self, token_rows):
    return self.tokenizer.decode_batch(token_rows)


def stand_in_pair(family: str = "t5", tokenizer_path: str | None = None,
                  name: str | None = None) -> StandInPair:
  drafter, verifier, q, p = tiny_pair(family)
  tok = (tokenizer_lib.Tokenizer(tokenizer_path, family, extra_ids=0)
         if tokenizer_path else train_tokenizer(family))
  assert tok.vocab_size <= verifier.vocab_size
  return StandInPair(name or f"tiny_{family}", drafter, verifier, q, p, tok,
                     is_encoder_decoder=family == "t5")


@dataclasses.dataclass
class ThreeLevelStandIn(StandInPair):
  """A stand-in with a medium model: small > medium > large, as
  default_models.DefaultPair with a medium model offers them."""

  medium: object = None
  m_params: object = None

  def levels(self):
    return [(self.drafter, self.q_params), (self.medium, self.m_params),
            (self.verifier, self.p_params)]


def three_levels(pair: StandInPair, name: str | None = None
                 ) -> ThreeLevelStandIn:
  """``pair`` with the verifier's first decoder layer as the medium level
  (sharing the verifier's params)."""
  fields = {f.name: getattr(pair, f.name) for f in dataclasses.fields(pair)}
  fields["name"] = name or pair.name
  return ThreeLevelStandIn(**fields,
                           medium=models.early_exit(pair.verifier, 1),
                           m_params=pair.p_params)


def stand_in_examples(n: int, seed: int = 0) -> list[dict]:
  texts = corpus(2 * n, seed)
  return [dict(id=f"ex{i}", inputs=texts[2 * i], targets=texts[2 * i + 1])
          for i in range(n)]


@pytest.fixture(scope="module")
def t5_pair():
  return stand_in_pair("t5")


# ---------------------------------------------------------------- configs


def test_run_config_normalises_and_keys():
  cfg = harness.RunConfig("token_v3", {"alpha": 0.3}, temperature=0,
                          top_p=0.9)
  assert cfg.knobs == (("alpha", 0.3),)
  assert cfg.top_p == 1.0  # ignored when greedy
  assert cfg.key == ("token_v3[alpha=0.3]|T=0.0|top_p=1.0|gamma=5|"
                     "max_new=None|bs=1|seed=0")
  assert hash(cfg) == hash(harness.RunConfig("token_v3", (("alpha", 0.3),),
                                             top_p=0.5))
  assert isinstance(cfg.sampling(), decoding.Greedy)
  samp = harness.RunConfig("token_v3", {"alpha": 0.3}, temperature=0.5,
                           top_p=0.9).sampling()
  assert isinstance(samp, decoding.TopP) and samp.p == 0.9
  assert isinstance(harness.RunConfig("chow", temperature=1.0).sampling(),
                    decoding.Temperature)
  # No draft block: gamma does not matter and is stored as 0.
  assert harness.RunConfig("target_only", gamma=7).gamma == 0
  assert harness.RunConfig.from_json(cfg.to_json()) == cfg
  # alpha=0 and alpha=0.0 are one setting; integer and string knobs keep
  # their type.
  assert harness.RunConfig("diff", {"alpha": 0}).key == harness.RunConfig(
      "diff", {"alpha": 0.0}).key
  tc = harness.RunConfig("token_cascade", {"alpha": 0.5, "chunk": 8.0})
  assert tc.knobs == (("alpha", 0.5), ("chunk", 8))
  assert tc.make_method().chunk == 8
  log = harness.RunConfig("chow", {"alpha": 0.7, "loss": "log"})
  assert log.make_method().target.loss == "log"
  assert log.knob_str == "alpha=0.7,loss=log"


@pytest.mark.parametrize("kwargs, message", [
    (dict(method="nope"), "unknown method 'nope'"),
    (dict(method="chow", knobs={"beta": 1.0}), "bad knobs \\['beta'\\]"),
    (dict(method="chow", knobs={"alpha": 2.0}), "Chow alpha"),
    (dict(method="chow", knobs={"alpha": [0.1, 0.2]}), "must be a number"),
    (dict(method="token_cascade", knobs={"chunk": 2.5}), "must be an integer"),
    (dict(method="bild", temperature=0.5), "bild is greedy-only"),
    (dict(method="chow", gamma=0), "gamma must be an integer >= 1"),
    (dict(method="chow", top_p=0.0), "top_p must be in \\(0, 1\\]"),
    (dict(method="chow", temperature=-1.0), "temperature must be"),
    (dict(method="spec_decode", hierarchy=(3, 6), tree="kary:2,3"),
     r"^a config drafts with a hierarchy OR a tree, got both \(hierarchy="
     r"\(3, 6\), tree='kary:2,3'\); make two configs$"),
    (dict(method="bild", hierarchy=(3, 6)),
     r"^hierarchy=\(3, 6\) needs a speculative top-level method \("
     r"spec_decode, lossy, a speculative cascade such as token_v3\), got "
     r"bild$"),
    (dict(method="bild", tree="kary:2,3"),
     r"^tree='kary:2,3': bild does not run on draft trees"),
    (dict(method="spec_decode", hierarchy=(3, 0)),
     r"^hierarchy buffers must be integers >= 1, got \(3, 0\)$"),
    (dict(method="spec_decode", hierarchy="3,6"),
     r"^hierarchy must be a tuple of buffer sizes"),
    (dict(method="spec_decode", tree="kary:2"),
     r"^tree spec 'kary:2': write 'kary:K,D' with K, D >= 1, e.g. "
     r"'kary:2,3'$"),
    (dict(method="spec_decode", tree="chain:0"),
     r"^tree spec 'chain:0': write 'chain:N' with N >= 1, e.g. 'chain:5'$"),
    (dict(method="spec_decode", tree="star:3"),
     r"^tree spec 'star:3': unknown shape 'star'; write 'kary:K,D'"),
    (dict(method="spec_decode", tree="kary:2,3/best"),
     r"^tree spec 'kary:2,3/best': unknown proposal 'best'; choose one of "
     r"iid, without_replacement, top_k$"),
    (dict(method="lossy_greedy", tree="kary:2,2/iid"),
     r"lossy_greedy is greedy, so i.i.d. siblings"),
    # Malformed even where it would be ignored.
    (dict(method="target_only", tree="kary"), r"^tree spec 'kary'"),
])
def test_run_config_errors(kwargs, message):
  with pytest.raises(ValueError, match=message):
    harness.RunConfig(**kwargs)


def test_grid_product_and_dedup():
  cfgs = harness.grid(
      {"target_only": {}, "bild": {"alpha_rollback": [1.0, 2.0]},
       "token_v3": {"alpha": [0.1, 0.3]}},
      temperature=[0.0, 0.5], top_p=[1.0, 0.9], gamma=[3, 5])
  keys = [c.key for c in cfgs]
  assert len(keys) == len(set(keys))
  count = lambda m: sum(c.method == m for c in cfgs)
  # target_only: T=0 (top-p dropped) + T=0.5 x 2 top-p; gamma dropped.
  assert count("target_only") == 3
  # bild is greedy-only: T=0 x 2 gammas x 2 alphas.
  assert count("bild") == 4
  assert {c.temperature for c in cfgs if c.method == "bild"} == {0.0}
  # token_v3: (1 + 2) sampling settings x 2 gammas x 2 alphas.
  assert count("token_v3") == 12
  assert harness.grid(["spec_decode", "spec_decode"]) == [
      harness.RunConfig("spec_decode")]


def test_chain_config_keys_are_unchanged():
  """Keys and JSON of configs without a hierarchy or tree are those rows
  were written with before both existed, so a resumed sweep finds them."""
  assert harness.row_key("t5_codegen", harness.RunConfig("spec_decode"),
                         "ex0") == (
      "t5_codegen|spec_decode[]|T=0.0|top_p=1.0|gamma=5|max_new=None|bs=1|"
      "seed=0|ex0")
  assert harness.RunConfig(
      "token_v3", {"alpha": 0.3}, temperature=0.5, top_p=0.9, gamma=3,
      max_new_tokens=32, batch_size=2, seed=7).key == (
          "token_v3[alpha=0.3]|T=0.5|top_p=0.9|gamma=3|max_new=32|bs=2|"
          "seed=7")
  old = {"method": "chow", "knobs": {"alpha": 0.1}, "temperature": 0.0,
         "top_p": 1.0, "gamma": 5, "max_new_tokens": None, "batch_size": 1,
         "seed": 0}  # the 'config' of a row written before
  cfg = harness.RunConfig.from_json(old)
  assert cfg.to_json() == old and cfg.draft == "" and cfg.hierarchy == ()
  assert cfg.key == ("chow[alpha=0.1]|T=0.0|top_p=1.0|gamma=5|max_new=None|"
                     "bs=1|seed=0")


def test_hierarchy_and_tree_configs_keys_labels_and_round_trip():
  hsd = harness.RunConfig("spec_decode", hierarchy=[3, 6], gamma=7)
  assert hsd.key == ("spec_decode[]|T=0.0|top_p=1.0|gamma=0|max_new=None|"
                     "bs=1|seed=0|hierarchy=3,6")
  # gamma does not apply: stored as 0, so a gamma sweep runs it once.
  assert hsd == harness.RunConfig("spec_decode", hierarchy=(3, 6), gamma=3)
  assert hsd.to_json() == {
      "method": "spec_decode", "knobs": {}, "temperature": 0.0, "top_p": 1.0,
      "gamma": 0, "max_new_tokens": None, "batch_size": 1, "seed": 0,
      "hierarchy": [3, 6]}
  assert harness.RunConfig.from_json(json.loads(json.dumps(
      hsd.to_json()))) == hsd
  assert hsd.label == "HSD small>medium>large (3,6)"
  tree = harness.RunConfig("token_v3", {"alpha": 0.5}, temperature=1.0,
                           tree=" kary: 2,3 /without_replacement", gamma=3)
  assert (tree.tree, tree.gamma, tree.draft) == ("kary:2,3", 0,
                                                 "tree=kary:2,3")
  assert tree.key == ("token_v3[alpha=0.5]|T=1.0|top_p=1.0|gamma=0|"
                      "max_new=None|bs=1|seed=0|tree=kary:2,3")
  assert harness.RunConfig.from_json(json.loads(json.dumps(
      tree.to_json()))) == tree
  assert tree.to_json()["tree"] == "kary:2,3" and "hierarchy" not in (
      tree.to_json())
  assert tree.label == "SpecCascade [TokenV3] tree 2x3"
  assert harness.RunConfig("spec_decode", tree="chain:4/top_k").label == (
      "SpecDecode tree chain 4 top_k")
  assert harness.RunConfig("token_v3", {"alpha": 0.5},
                           hierarchy=(2,)).label == (
                               "HSD small>large (2) [SpecCascade [TokenV3]]")
  assert drafts.parse_tree("kary:2,3") == decoding.Tree(
      decoding.Topology.kary(2, 3))
  assert drafts.parse_tree("chain:4/top_k") == decoding.Tree(
      decoding.Topology.chain(4), proposal="top_k")
  # Without a draft block the structure is dropped, like gamma.
  assert harness.RunConfig("target_only", hierarchy=(3, 6)) == (
      harness.RunConfig("target_only"))
  assert harness.RunConfig("seq_cascade", {"alpha": 0.9},
                           tree="kary:2,3").draft == ""


def test_grid_crosses_draft_structures():
  cfgs = harness.grid(
      {"target_only": {}, "bild": {}, "spec_decode": {}}, gamma=[3, 5],
      drafts=[{}, {"hierarchy": (3, 6)}, {"tree": "kary:2,3"}])
  tail = "|max_new=None|bs=1|seed=0"
  # target-only once; BiLD only on the chain (no trees, not speculative);
  # SpecDecode on both chains, the hierarchy and the tree (gamma dropped).
  assert [c.key for c in cfgs] == [
      f"target_only[]|T=0.0|top_p=1.0|gamma=0{tail}",
      f"bild[]|T=0.0|top_p=1.0|gamma=3{tail}",
      f"bild[]|T=0.0|top_p=1.0|gamma=5{tail}",
      f"spec_decode[]|T=0.0|top_p=1.0|gamma=3{tail}",
      f"spec_decode[]|T=0.0|top_p=1.0|gamma=5{tail}",
      f"spec_decode[]|T=0.0|top_p=1.0|gamma=0{tail}|hierarchy=3,6",
      f"spec_decode[]|T=0.0|top_p=1.0|gamma=0{tail}|tree=kary:2,3"]
  with pytest.raises(ValueError, match="each draft structure is a dict "
                     "with 'hierarchy' and/or 'tree'"):
    harness.grid(["spec_decode"], drafts=[{"hsd": (3, 6)}])


def test_request_id_is_stable():
  assert harness.request_id("ex0") == harness.request_id("ex0")
  assert harness.request_id("ex0") != harness.request_id("ex1")
  assert 0 <= harness.request_id("x" * 100) < 2**31


# ---------------------------------------------------------------- running


def test_rows_match_generate_and_warmup_is_untimed(t5_pair, tmp_path):
  examples = stand_in_examples(3)
  examples[2]["inputs"] = " ".join(WORDS)  # longer than 16 tokens
  cfgs = [harness.RunConfig("target_only"),
          harness.RunConfig("token_v3", {"alpha": 0.2}, gamma=3),
          harness.RunConfig("token_v3", {"alpha": 0.6}, gamma=3)]
  path = str(tmp_path / "r.jsonl")
  stats = harness.run(t5_pair, cfgs, examples, path, progress=False)
  rows = harness.load_rows(path)
  assert stats.written == len(rows) == 9 and stats.skipped == 0
  # Encoder inputs share one padded width (that of the longest, 32), and
  # alpha is traced: one program per method.
  enc, width = harness.encode_examples(t5_pair, examples)
  own = [harness.padded_width([e["inputs"]]) for e in enc]
  assert own == [16, 16, 32] and width == stats.pad_width == 32
  assert stats.warmups == 2
  assert len({r["key"] for r in rows}) == 9
  # Each row equals a direct generate call on that example alone, at its
  # own width: the common width changes nothing.
  for row in rows:
    cfg = harness.RunConfig.from_json(row["config"])
    i = int(row["example_id"][2:])
    res = decoding.generate(
        cfg.make_method(), t5_pair.drafter, t5_pair.verifier,
        t5_pair.q_params, t5_pair.p_params, inputs=[enc[i]["inputs"]],
        gamma=max(cfg.gamma, 1), max_new_tokens=t5_pair.max_new_tokens,
        request_ids=[harness.request_id(row["example_id"])])
    assert row["tokens"] == res.sequences()[0]
    assert row["num_tokens"] == int(res.lengths[0])
    assert row["prediction"] == t5_pair.tokenizer.decode(res.sequences()[0])
    assert row["verifier_calls"] == int(res.verifier_calls[0])
    assert row["drafter_calls"] == int(res.drafter_calls[0])
    assert row["accepted"] == int(res.accepted[0])
    assert row["drafted"] == int(res.drafted[0])
    assert row["rejected"] == int(res.level_rejected[0, -1])
    assert row["deferrals"] == pytest.approx(float(res.deferrals[0]))
    assert row["latency_s"] > 0
  # Rerunning skips everything.
  again = harness.run(t5_pair, cfgs, examples, path, progress=False)
  assert (again.written, again.skipped, again.warmups) == (0, 9, 0)


def test_timing_counts_only_timed_calls(t5_pair, tmp_path):
  """A fake clock: the warm-up call's time never reaches a row."""
  ticks = iter(range(1000))
  clock = lambda: float(next(ticks))
  examples = stand_in_examples(2)
  path = str(tmp_path / "r.jsonl")
  stats = harness.run(t5_pair, [harness.RunConfig("drafter_only")], examples,
                      path, progress=False, clock=clock)
  rows = harness.load_rows(path)
  # Clock reads: start, warm-up (2), timed (2), timed (2), end.
  assert [r["latency_s"] for r in rows] == [1.0, 1.0]
  assert (stats.warmups, stats.warmup_s, stats.decode_s) == (1, 1.0, 2.0)


def test_repeats_keep_the_fastest_call(t5_pair, tmp_path):
  # Clock reads: start, warm-up (0, 10), three timed calls (10, 13), (13, 14),
  # (14, 16), end.
  ticks = iter([0.0, 0.0, 10.0, 10.0, 13.0, 13.0, 14.0, 14.0, 16.0, 16.0])
  path = str(tmp_path / "r.jsonl")
  stats = harness.run(t5_pair, [harness.RunConfig("drafter_only")],
                      stand_in_examples(1), path, progress=False,
                      clock=lambda: next(ticks), repeats=3)
  (row,) = harness.load_rows(path)
  assert row["latency_s"] == 1.0
  assert row["batch_latency_runs_s"] == [3.0, 1.0, 2.0]
  assert (stats.warmup_s, stats.decode_s, stats.wall_s) == (10.0, 6.0, 16.0)
  with pytest.raises(ValueError, match="repeats must be >= 1"):
    harness.run(t5_pair, [], [], path, repeats=0)


def test_batched_rows_equal_batch_one(t5_pair, tmp_path):
  examples = stand_in_examples(3)
  one = str(tmp_path / "one.jsonl")
  three = str(tmp_path / "three.jsonl")
  harness.run(t5_pair, [harness.RunConfig("drafter_only", temperature=1.0)],
              examples, one, progress=False)
  harness.run(t5_pair, [harness.RunConfig("drafter_only", temperature=1.0,
                                          batch_size=3)],
              examples, three, progress=False)
  a, b = harness.load_rows(one), harness.load_rows(three)
  # Per-request keys: sampled tokens do not depend on the batch.
  assert [r["tokens"] for r in a] == [r["tokens"] for r in b]
  assert [r["batch"] for r in b] == [3, 3, 3]
  assert b[0]["latency_s"] == pytest.approx(b[0]["batch_latency_s"] / 3)


def test_decoder_only_prompts_share_one_width(tmp_path):
  """Prompts of different widths: one program, rows as if decoded alone."""
  pair = stand_in_pair("gemma")
  examples = stand_in_examples(3)
  examples[1]["inputs"] = " ".join(WORDS)  # longer than 16 tokens
  cfgs = [harness.RunConfig("chow", {"alpha": 0.5}, gamma=2),
          harness.RunConfig("chow", {"alpha": 0.9}, gamma=2)]
  path = str(tmp_path / "g.jsonl")
  stats = harness.run(pair, cfgs, examples, path, progress=False)
  rows = harness.load_rows(path)
  assert [r["example_id"] for r in rows] == ["ex0", "ex1", "ex2"] * 2
  enc, width = harness.encode_examples(pair, examples)
  own = [harness.padded_width([e["prompts"]]) for e in enc]
  assert own == [16, 32, 16] and width == stats.pad_width == 32
  assert stats.warmups == 1  # one width, alpha traced: one program
  assert all(r["drafted"] > 0 for r in rows)
  for row in rows:
    cfg = harness.RunConfig.from_json(row["config"])
    i = int(row["example_id"][2:])
    res = decoding.generate(
        cfg.make_method(), pair.drafter, pair.verifier, pair.q_params,
        pair.p_params, prompts=[enc[i]["prompts"]], gamma=2,
        max_new_tokens=pair.max_new_tokens,
        request_ids=[harness.request_id(row["example_id"])])
    assert row["tokens"] == res.sequences()[0]
    assert (row["accepted"], row["drafted"]) == (int(res.accepted[0]),
                                                 int(res.drafted[0]))


HSD = harness.RunConfig("spec_decode", hierarchy=(3, 6))
TREE = harness.RunConfig("spec_decode", tree="kary:2,3")


def test_hierarchy_and_tree_rows_are_lossless(t5_pair, tmp_path):
  """Greedy HSD over small > medium > large and SpecDecode on a 2x3 tree
  give target-only's tokens; rows equal direct decode calls."""
  pair = three_levels(t5_pair)
  examples = stand_in_examples(3)
  path = str(tmp_path / "r.jsonl")
  stats = harness.run(pair, [harness.RunConfig("target_only"), HSD, TREE],
                      examples, path, progress=False)
  assert (stats.written, stats.warmups) == (9, 3)
  rows = {(r["config_key"], r["example_id"]): r
          for r in harness.load_rows(path)}
  base = harness.RunConfig("target_only").key
  enc, width = harness.encode_examples(pair, examples)
  for i, ex in enumerate(examples):
    target = rows[(base, ex["id"])]["tokens"]
    hsd, tree = rows[(HSD.key, ex["id"])], rows[(TREE.key, ex["id"])]
    assert hsd["tokens"] == target and tree["tokens"] == target
    assert len(target) == pair.max_new_tokens  # no early EOS: 12 tokens
    rid = [harness.request_id(ex["id"])]
    res = generate_hierarchy(pair.levels(), [3, 6], inputs=[enc[i]["inputs"]],
                             max_new_tokens=pair.max_new_tokens,
                             request_ids=rid, pad_to=width)
    # Per-level counters, cheapest first; the verifier is the top level.
    assert hsd["level_calls"] == res.calls[0].tolist()
    assert len(hsd["level_calls"]) == 3
    assert hsd["level_drafted"] == res.level_drafted[0].tolist()
    assert hsd["level_accepted"] == res.level_accepted[0].tolist()
    assert hsd["verifier_calls"] == hsd["level_calls"][2]
    assert hsd["drafter_calls"] == sum(hsd["level_calls"][:2])
    assert (hsd["drafted"], hsd["accepted"]) == (hsd["level_drafted"][2],
                                                 hsd["level_accepted"][2])
    res = decoding.generate(
        TREE.make_method(), pair.drafter, pair.verifier, pair.q_params,
        pair.p_params, inputs=[enc[i]["inputs"]], pad_to=width,
        tree=decoding.Tree(decoding.Topology.kary(2, 3)),
        max_new_tokens=pair.max_new_tokens, request_ids=rid)
    assert tree["tokens"] == res.sequences()[0]
    assert (tree["drafted"], tree["accepted"], tree["verifier_calls"]) == (
        int(res.drafted[0]), int(res.accepted[0]), int(res.verifier_calls[0]))
    assert tree["drafted"] == 14 * tree["verifier_calls"]  # 14 nodes a block
    assert "level_calls" not in tree


def test_hierarchy_needs_one_level_more_than_buffers(t5_pair, tmp_path):
  path = tmp_path / "r.jsonl"
  with pytest.raises(ValueError) as err:
    harness.run(t5_pair, [harness.RunConfig("target_only"), HSD],
                stand_in_examples(2), str(path), progress=False)
  assert str(err.value) == (
      "config spec_decode[]|T=0.0|top_p=1.0|gamma=0|max_new=None|bs=1|seed=0"
      "|hierarchy=3,6 cannot run: hierarchy=(3, 6) needs 3 levels (small>"
      "medium>large) but pair 'tiny_t5' has 2 (no medium model: build the "
      "assets with one, see docs/default_models.md); give 1 buffer size(s) "
      "or use a pair with 3 levels")
  assert not path.exists()  # refused before anything ran
  # A pair without levels() offers its drafter and verifier.
  (q, qp), (p, pp) = drafts.pair_levels(t5_pair)
  assert (q, qp, p, pp) == (t5_pair.drafter, t5_pair.q_params,
                            t5_pair.verifier, t5_pair.p_params)
  assert drafts.unsupported(t5_pair, (3,)) is None
  three = three_levels(t5_pair)
  assert drafts.unsupported(three, (3, 6)) is None
  assert drafts.unsupported(three, (3,)) == (
      "hierarchy=(3,) needs 2 levels (small>large) but pair 'tiny_t5' has 3;"
      " give 2 buffer size(s) or use a pair with 2 levels")


# ---------------------------------------------------------------- the file


def _row(key, **kw):
  return dict(key=key, **kw)


def test_torn_last_line_is_dropped_and_rerun(tmp_path):
  path = str(tmp_path / "r.jsonl")
  with harness.ResultsFile(path) as f:
    f.append(_row("a", v=1))
    f.append(_row("b", v=2))
  with open(path, "ab") as f:
    f.write(b'{"key": "c", "v"')  # killed mid-write
  assert [r["key"] for r in harness.load_rows(path)] == ["a", "b"]
  with pytest.warns(UserWarning, match="torn last line"):
    with harness.ResultsFile(path) as f:
      assert f.keys == {"a", "b"}
      f.append(_row("c", v=3))
  with open(path, encoding="utf-8") as f:
    lines = f.read().splitlines()
  assert [json.loads(l) for l in lines] == [
      _row("a", v=1), _row("b", v=2), _row("c", v=3)]


def test_corrupt_middle_line_is_an_error(tmp_path):
  path = str(tmp_path / "r.jsonl")
  with open(path, "w") as f:
    f.write('{"key": "a"}\nnot json\n{"key": "b"}\n')
  with pytest.raises(ValueError, match=r"r.jsonl:2: corrupt results line"):
    harness.load_rows(path)


def test_duplicate_append_and_concurrent_writer_are_refused(tmp_path):
  path = str(tmp_path / "r.jsonl")
  with harness.ResultsFile(path) as f:
    f.append(_row("a"))
    with pytest.raises(ValueError, match="already in"):
      f.append(_row("a"))
    with pytest.raises(RuntimeError, match="another process"):
      with harness.ResultsFile(path):
        pass


_SWEEP = textwrap.dedent("""
    import sys
    from specdec_jax.eval import harness
    from tests.eval import test_harness as th
    pair = th.stand_in_pair("t5", tokenizer_path=sys.argv[2])
    harness.run(pair, th.kill_test_configs(), th.stand_in_examples(4),
                sys.argv[1], progress=False)
""")


def kill_test_configs():
  # The programs of test_rows_match_generate_and_warmup_is_untimed (cached
  # in this process) plus drafter-only; 4 configs x 4 examples.
  return [harness.RunConfig("target_only"), harness.RunConfig("drafter_only"),
          harness.RunConfig("token_v3", {"alpha": 0.2}, gamma=3),
          harness.RunConfig("token_v3", {"alpha": 0.5}, gamma=3)]


def _count_lines(path):
  if not os.path.exists(path):
    return 0
  with open(path, "rb") as f:
    return f.read().count(b"\n")


@pytest.mark.slow
def test_sigkill_mid_sweep_then_resume(tmp_path):
  tok_path = str(tmp_path / "tok.model")
  train_tokenizer("t5", tok_path)
  # The rerun reads the first run's compiled programs from disk.
  env = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu",
             JAX_COMPILATION_CACHE_DIR=str(tmp_path / "jax_cache"),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
             JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
  path = str(tmp_path / "killed.jsonl")
  cmd = [sys.executable, "-c", _SWEEP, path, tok_path]
  total = len(kill_test_configs()) * 4
  proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT)
  deadline = time.time() + 120
  while _count_lines(path) < 3:
    assert proc.poll() is None, proc.stdout.read().decode()
    assert time.time() < deadline, "the sweep wrote no rows in 120 s"
    time.sleep(0.005)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  done_at_kill = _count_lines(path)
  assert 3 <= done_at_kill < total, "the kill came too late to test resuming"
  # Worst case on top: the kill tore a line in the middle of writing it.
  with open(path, "ab") as f:
    f.write(b'{"key": "tiny_t5|token_v3[alpha=0.2]|T=0.0|top_p=1.0|gam')
  out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=300, check=True)
  assert "torn last line" in out.stderr
  resumed = harness.load_rows(path)
  # An uninterrupted run of the same sweep, in this process.
  pair = stand_in_pair("t5", tokenizer_path=tok_path)
  clean = str(tmp_path / "clean.jsonl")
  harness.run(pair, kill_test_configs(), stand_in_examples(4), clean,
              progress=False)
  reference = harness.load_rows(clean)
  assert _count_lines(path) == len(resumed) == total
  assert len({r["key"] for r in resumed}) == total
  assert sorted(r["key"] for r in resumed) == sorted(
      r["key"] for r in reference)
  by_key = {r["key"]: r for r in reference}
  for r in resumed:  # greedy: the same tokens however the run was split
    assert r["tokens"] == by_key[r["key"]]["tokens"]
