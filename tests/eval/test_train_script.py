"""The training script's resumable teacher passes (scripts/train_default_models.py)."""

import importlib.util
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "train_default_models.py")


def _script():
  spec = importlib.util.spec_from_file_location("train_default_models", SCRIPT)
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module  # its dataclasses look the module up
  spec.loader.exec_module(module)
  return module


def test_a_saved_teacher_pass_is_reused_and_a_partial_one_is_not(tmp_path,
                                                                   capsys):
  script = _script()
  wd = str(tmp_path / "teacher")
  assert script._load_pass(wd, "train", "greedy", 2) is None
  saved = dict(preds=["a b", "c"], stats=dict(rows=2, mean_tokens=1.5,
                                               seconds=3.0))
  script._write_json(script._pass_path(wd, "train", "greedy"), saved)
  assert os.listdir(wd) == ["train_greedy_outputs.json"]  # no .tmp left
  assert script._load_pass(wd, "train", "greedy", 2) == saved
  assert script._load_pass(wd, "train", "sampled", 2) is None
  # A pass over a different number of examples (another corpus) is not used.
  assert script._load_pass(wd, "train", "greedy", 3) is None
  assert "2 outputs, expected 3" in capsys.readouterr().out
  with open(os.path.join(wd, "train_greedy_outputs.json")) as f:
    assert json.load(f)["preds"] == ["a b", "c"]
