"""One process per build stage: a lock file that other processes wait on.

``build.py`` runs every stage under ``stage_lock``, so the
build can be started as several processes that share stages (e.g. both
families' whole chains plus a process that runs the small models'
pretraining early): a process that reaches a stage another live process is
running waits until it ends, then finds the stage done and skips it.

The lock file ``<workdir>/<task>/<stage>.lock`` holds the owner's pid and
the machine's boot id. It is stale, and taken over, when that pid is not
alive or the boot id differs (a killed process, a rebooted or replaced
machine), so a lock never outlives its process for long.
"""

from __future__ import annotations

import contextlib
import json
import os
import time

BOOT_ID = "/proc/sys/kernel/random/boot_id"


def boot_id() -> str:
  """This boot's id ('' where /proc does not give one)."""
  try:
    with open(BOOT_ID) as f:
      return f.read().strip()
  except OSError:
    return ""


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


def owner(path: str) -> dict | None:
  """The live owner {'pid', 'boot_id'} of the lock at ``path``, or None
  (no lock, an unreadable one, or a stale one)."""
  try:
    with open(path) as f:
      held = json.load(f)
    pid = int(held["pid"])
  except (OSError, ValueError, KeyError, TypeError):
    return None
  if held.get("boot_id", "") != boot_id() or not _alive(pid):
    return None
  return held


@contextlib.contextmanager
def stage_lock(path: str, what: str, log=print, poll_seconds: float = 30.0):
  """Holds the lock at ``path`` for the body, waiting while another live
  process holds it.

  Args:
    path: the lock file.
    what: the stage's name, for the log.
    log: called with one line when the wait starts and ends.
    poll_seconds: how often a waiting process looks again.
  """
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  me = json.dumps(dict(pid=os.getpid(), boot_id=boot_id()))
  waited = None
  tmp = f"{path}.{os.getpid()}.tmp"
  with open(tmp, "w") as f:
    f.write(me)
  try:
    while True:
      try:  # a hard link appears with its content: no half-written lock
        os.link(tmp, path)
        break
      except FileExistsError:
        pass
      held = owner(path)
      if held is None:  # stale: take it over
        with contextlib.suppress(FileNotFoundError):
          os.remove(path)
        continue
      if held["pid"] == os.getpid():
        raise RuntimeError(f"{what}: this process already holds {path}")
      if waited is None:
        waited = time.time()
        log(f"{what}: running in process {held['pid']}; waiting for it")
      time.sleep(poll_seconds)
  finally:
    os.remove(tmp)
  if waited is not None:
    log(f"{what}: lock free after {time.time() - waited:.0f}s")
  try:
    yield
  finally:
    with contextlib.suppress(FileNotFoundError):
      os.remove(path)
