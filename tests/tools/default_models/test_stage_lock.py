"""tools/default_models/stage_lock.py: one process per build stage, stale locks taken
over (dead pid, another boot)."""

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from tests.tools.default_models import load_tool
from tools.default_models import stage_lock as sl


def _write(path, pid, boot):
  with open(path, "w") as f:
    json.dump(dict(pid=pid, boot_id=boot), f)


def test_the_lock_is_held_for_the_body_and_removed_after(tmp_path):
  path = str(tmp_path / "t" / "medium.lock")
  with sl.stage_lock(path, "t/medium", poll_seconds=0.01):
    assert sl.owner(path) == dict(pid=os.getpid(), boot_id=sl.boot_id())
    with pytest.raises(RuntimeError, match="already holds"):
      with sl.stage_lock(path, "t/medium", poll_seconds=0.01):
        pass
  assert os.listdir(tmp_path / "t") == []  # no lock, no temporary file
  with pytest.raises(ValueError):  # released on an exception too
    with sl.stage_lock(path, "t/medium", poll_seconds=0.01):
      raise ValueError("stage failed")
  assert not os.path.exists(path)


def test_a_live_owner_is_waited_for_and_a_dead_one_taken_over(tmp_path):
  path = str(tmp_path / "small.lock")
  holder = subprocess.Popen([sys.executable, "-c",
                             "import time; time.sleep(1.0)"])
  _write(path, holder.pid, sl.boot_id())
  lines = []
  t = time.time()
  reaper = threading.Thread(target=holder.wait)  # no zombie: pid disappears
  reaper.start()
  with sl.stage_lock(path, "t/small", lines.append, poll_seconds=0.05):
    waited = time.time() - t
    assert sl.owner(path)["pid"] == os.getpid()
  reaper.join()
  assert waited >= 0.5
  assert lines[0] == f"t/small: running in process {holder.pid}; waiting for it"
  assert lines[1].startswith("t/small: lock free after")


def test_stale_locks_do_not_block(tmp_path):
  path = str(tmp_path / "eval.lock")
  # A live pid (ours is excluded, so use the parent) on another boot.
  _write(path, os.getppid(), "another-boot")
  assert sl.owner(path) is None
  lines = []
  with sl.stage_lock(path, "t/eval", lines.append, poll_seconds=60):
    pass
  assert lines == []
  with open(path, "w") as f:
    f.write("{torn")  # a half-written lock is stale too
  with sl.stage_lock(path, "t/eval", lines.append, poll_seconds=60):
    pass
  assert lines == []


def test_a_stage_without_its_inputs_names_the_missing_stage(tmp_path):
  import types
  script = load_tool("build")
  fam = types.SimpleNamespace(task="t5_docstring")
  args = types.SimpleNamespace(workdir=str(tmp_path), force=False)
  script.mark_done(str(tmp_path / "t5_docstring" / "small_pretrain"), {})
  with pytest.raises(RuntimeError, match="t5_docstring/small needs the "
                     "finished 'teacher' stage"):
    script.stage_distill(fam, "small", args, None)
  with pytest.raises(RuntimeError, match="t5_docstring/teacher needs the "
                     "finished 'large' stage.*--only large"):
    script.stage_teacher(fam, args, None)


def test_a_self_distilling_tasks_stages_wait_for_each_other(tmp_path):
  """t5_codegen: large -> self_teacher -> large_distill -> teacher (of the
  shipped, distilled large) -> students; each names what it misses."""
  import types
  script = load_tool("build")
  fam = types.SimpleNamespace(task="t5_codegen")
  args = types.SimpleNamespace(workdir=str(tmp_path), force=False,
                               smoke=True, smoke_steps=2)
  for stage in ("small_pretrain", "large"):
    script.mark_done(str(tmp_path / "t5_codegen" / stage), {})
  with pytest.raises(RuntimeError, match="t5_codegen/small needs the "
                     "finished 'teacher' stage"):
    script.stage_distill(fam, "small", args, None)
  with pytest.raises(RuntimeError, match="t5_codegen/teacher needs the "
                     "finished 'large_distill' stage.*--only large_distill"):
    script.stage_teacher(fam, args, None)
  with pytest.raises(RuntimeError, match="t5_codegen/large_distill needs "
                     "the finished 'self_teacher' stage"):
    script.stage_large_distill(fam, args, None)
  assert script.STAGES.index("self_teacher") < script.STAGES.index(
      "large_distill") < script.STAGES.index("teacher")
