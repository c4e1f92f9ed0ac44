"""`specdec_jax plan-tree` end to end on tiny random models, then a decode
that includes the gin file it wrote."""

import gin
import pytest

from specdec_jax import decoding, main, structure_specs


@pytest.fixture(autouse=True)
def clean_gin():
  gin.clear_config()
  yield
  gin.clear_config()


@pytest.mark.slow
def test_plan_tree_writes_a_gin_file_that_decode_uses(tmp_path, capsys):
  out = tmp_path / "tree.gin"
  main.parse_gin(["runs/plan_tree.gin", "pairs/tiny_random.gin"],
                 ["TEMPERATURE = 1.0", "MAX_NODES = 6", "MAX_DEPTH = 3",
                  "CHILDREN = 3", "NUM_PROMPTS = 2", "NEW_TOKENS = 6",
                  f"OUTPUT = '{out}'"])
  report = main.run()
  printed = capsys.readouterr().out
  assert "predicted tokens per verifier call" in printed
  assert "predicted speedup over target-only" in printed
  assert len(report["acceptance"]) == 3 and report["tokens_per_call"] > 1
  assert out.read_text() == report["gin"]
  gin.clear_config()
  req = tmp_path / "req.jsonl"
  req.write_text('{"tokens": [2, 5, 9]}\n')
  main.parse_gin(["runs/decode.gin", "pairs/tiny_random.gin", str(out)],
                 [f"INPUT_FILE = '{req}'", f"OUTPUT_DIR = '{tmp_path}'",
                  "MAX_NEW_TOKENS = 5"])
  rows = main.run()
  assert rows[0]["num_tokens"] == 5
  assert rows[0]["drafted"] == len(report["parents"]) * rows[0][
      "verifier_calls"]


def test_tree_spec_needs_exactly_one_shape():
  with pytest.raises(ValueError, match="exactly one of parents, paths, "
                     "kary, chain; got none"):
    structure_specs.tree_spec()
  with pytest.raises(ValueError, match="got \\['chain', 'kary'\\]"):
    structure_specs.tree_spec(kary=(2, 2), chain=3)
  tree = structure_specs.tree_spec(paths=[[0], [1], [0, 0]], proposal="top_k")
  assert tree == decoding.Tree(decoding.Topology((-1, -1, 0)), "top_k")


@pytest.mark.parametrize("bindings,match", [
    (["MAX_NODES = 5000"], "max_nodes must be an integer <= 1,024 \\(the tree "
     "planner's bound, tree_shape.MAX_PLAN_NODES\\), got 5000"),
    (["MAX_DEPTH = 100"], "max_depth must be an integer <= 64"),
    (["MAX_NODES = 1000", "MAX_DEPTH = 64"], "64,000 tree budgets to cost, "
     "more than 16,384"),
    (["OUTPUT = '/etc/hostname/tree.gin'"], "cannot write OUTPUT "
     "/etc/hostname/tree.gin: /etc/hostname is a file, not a directory"),
    (["include 'methods/lossy_greedy.gin'", "TEMPERATURE = 0.7"],
     "LossyGreedy is a greedy method; use sampling=Greedy\\(\\) or "
     "temperature 0"),
])
def test_bad_plan_tree_input_fails_before_calibration(bindings, match,
                                                      monkeypatch):
  """Issue 43: bounds, OUTPUT and greedy-only are checked up front."""
  from specdec_jax.decoding import planners  # pylint: disable=g-import-not-at-top
  def fail(*args, **kwargs):
    raise AssertionError("calibration ran")
  monkeypatch.setattr(planners, "calibrate", fail)
  main.parse_gin(["runs/plan_tree.gin", "pairs/tiny_random.gin"], bindings)
  with pytest.raises(ValueError, match=match):
    main.run()


def test_huge_gin_trees_are_refused_before_building():
  """Issue 43: tree_spec.kary=(2, 30) was killed by the OOM killer."""
  with pytest.raises(ValueError, match="Topology.kary\\(2, 30\\) has "
                     "2,147,483,646 nodes, more than the limit of 4,096"):
    structure_specs.tree_spec(kary=(2, 30))


def test_stage_bar_names_each_stage_on_stderr(capsys):
  """Issue 43: the planners show their progress (stage by stage)."""
  from specdec_jax import plan_tree_run  # pylint: disable=g-import-not-at-top
  bar = plan_tree_run.StageBar("plan-tree", ["calibrating", "planning"])
  bar.next()
  bar.next()
  err = capsys.readouterr().err
  assert "plan-tree" in err and "2/2" in err and "planning" in err
