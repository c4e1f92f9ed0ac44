"""Hierarchies on the command line: HierarchySpec checks (before anything
loads), the gin file plan-hierarchy writes (parsed back), decode's
hierarchy errors."""

import gin
import pytest

from specdec_jax import decoding, main, runs
from specdec_jax.hierarchy_spec import EarlyExit, HierarchySpec, hierarchy_gin

TINY_V = runs.ModelSpec(preset="gemma2_tiny")
TINY_D = runs.ModelSpec(preset="gemma_tiny", role="drafter", seed=1)


@pytest.fixture(autouse=True)
def clean_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def test_written_gin_parses_back_to_the_same_hierarchy(tmp_path, monkeypatch):
  medium = runs.ModelSpec(default_pair="gemma_completion", role="medium",
                          dtype="bfloat16")
  text = hierarchy_gin([TINY_D, "exit:1", medium], [2, 1, 4],
                       note="Planned by hand.")
  assert text.startswith("# Hierarchy: gemma_tiny@seed1 -> exit:1 -> "
                         "gemma_completion/medium -> verifier, buffers [2, 1, "
                         "4].\n# Planned by hand.\n")
  path = tmp_path / "h.gin"
  path.write_text(text)
  seen = {}
  monkeypatch.setattr(runs, "run_decode", lambda *a, hierarchy=None: (
      seen.update(hierarchy=hierarchy) or runs.DecodeReport(
          rows=[], new_rows=[], resumed=0, failed=[], seconds=0.0,
          output=None)))
  main.parse_gin(["runs/decode.gin", "pairs/tiny_random.gin", str(path)], [])
  main.run()
  assert seen["hierarchy"] == HierarchySpec((TINY_D, EarlyExit(1), medium),
                                            (2, 1, 4))


@pytest.mark.parametrize("kwargs,match", [
    (dict(drafters=[], buffers=[]), "at least one drafter level"),
    (dict(drafters="exit:1", buffers=[2]), "at least one drafter level"),
    (dict(drafters=["exit:1"], buffers=[2, 3]),
     r"1 drafter level\(s\) need 1 buffer sizes \(T_0 .. T_0\), got 2"),
    (dict(drafters=["exit:1", "exit:1"], buffers=[2, 0]),
     "hierarchy buffer T_1 must be an integer >= 1, got 0"),
    (dict(drafters=["exit:1"], buffers=[2.5]),
     "hierarchy buffer T_0 must be an integer >= 1, got 2.5"),
    (dict(drafters=["exit:0"], buffers=[2]),
     "unknown hierarchy level 0 'exit:0': a level is a ModelSpec"),
    (dict(drafters=[TINY_D, "small"], buffers=[2, 2]),
     "unknown hierarchy level 1 'small'"),
])
def test_bad_hierarchy_specs(kwargs, match):
  with pytest.raises(ValueError, match=match):
    HierarchySpec(kwargs["drafters"], kwargs["buffers"])


@pytest.mark.parametrize("spec,method,match", [
    (HierarchySpec([TINY_D, "exit:2"], [2, 2]), "spec_decode",
     "hierarchy level 1 is an early exit after 2 decoder layers but the "
     "verifier has 2; use 'exit:1' .. 'exit:1'"),
    (HierarchySpec([runs.ModelSpec(preset="gemma_2b")], [2]), "spec_decode",
     r"hierarchy level 0 \(gemma_2b\) has a vocabulary of 256128 ids but the "
     r"verifier has 64"),
    (HierarchySpec([runs.ModelSpec(preset="t5_tiny")], [2]), "spec_decode",
     r"hierarchy level 0 \(t5_tiny\) and the verifier must both be "
     r"encoder-decoder"),
    (HierarchySpec(["exit:1"], [2]), "target_only",
     "a hierarchy's top level verifies with a speculative method"),
    (HierarchySpec([TINY_D, "exit:1"], [2, 2],
                   {1: decoding.make_method("token_v3")}), "opt",
     "lenient intermediate levels need an exact top level"),
    (HierarchySpec([TINY_D, "exit:1"], [2, 2],
                   {2: decoding.make_method("token_v3")}), "spec_decode",
     "lenient levels are the intermediate ones, 1..1; got level 2"),
])
def test_decode_with_a_bad_hierarchy_fails_before_loading(spec, method, match,
                                                          capsys):
  with pytest.raises(ValueError, match=match):
    runs.run_decode(TINY_D, TINY_V, decoding.make_method(method),
                    input_file="/nonexistent.jsonl", hierarchy=spec)
  assert "RANDOM weights" not in capsys.readouterr().err


def test_decode_takes_a_tree_or_a_hierarchy_not_both():
  with pytest.raises(ValueError, match=r"decode takes a tree \(run.tree\) or "
                     r"a hierarchy \(run.hierarchy\), not both"):
    runs.run_decode(TINY_D, TINY_V, decoding.make_method("spec_decode"),
                    tree=decoding.Tree(decoding.Topology.chain(2)),
                    hierarchy=HierarchySpec(["exit:1"], [2]))
