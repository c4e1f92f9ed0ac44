"""The repository stays clonable and small enough for a device machine.

Fails when a tracked file is over 25 MB or all tracked files together are over
60 MB (issue 42: build state, experiment logs and candidate runs live outside
the tree). Skipped outside a git checkout (e.g. an unpacked sdist).
"""

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_FILE_BYTES = 25 * 10**6
MAX_TREE_BYTES = 60 * 10**6


def tracked_sizes(root: str = ROOT) -> dict[str, int]:
  """{path relative to root: bytes} of every file git tracks (and that exists).

  Raises:
    FileNotFoundError: root is not inside a git checkout (or git is missing).
  """
  if shutil.which("git") is None:
    raise FileNotFoundError("git is not installed")
  proc = subprocess.run(["git", "-C", root, "ls-files", "-z"],
                        capture_output=True, check=False)
  if proc.returncode != 0:
    raise FileNotFoundError(f"{root} is not a git checkout: "
                            f"{proc.stderr.decode(errors='replace').strip()}")
  sizes = {}
  for rel in proc.stdout.decode().split("\0"):
    path = os.path.join(root, rel)
    if rel and os.path.isfile(path) and not os.path.islink(path):
      sizes[rel] = os.path.getsize(path)
  return sizes


def oversized(sizes: dict[str, int]) -> tuple[list[str], int]:
  """(files over MAX_FILE_BYTES with their sizes, total bytes)."""
  big = [f"{p} ({n / 1e6:.1f} MB)" for p, n in sorted(sizes.items())
         if n > MAX_FILE_BYTES]
  return big, sum(sizes.values())


@pytest.fixture(scope="module")
def sizes():
  try:
    return tracked_sizes()
  except FileNotFoundError as e:
    pytest.skip(f"not a git checkout: {e}")


def test_no_tracked_file_is_over_25_mb(sizes):
  big, _ = oversized(sizes)
  assert not big, (f"tracked files over {MAX_FILE_BYTES / 1e6:.0f} MB: {big}; "
                   "keep build state and data bundles out of the tree "
                   "(tools/default_models/README.md says how to restore them)")


def test_the_tracked_tree_is_at_most_60_mb(sizes):
  _, total = oversized(sizes)
  assert total <= MAX_TREE_BYTES, (
      f"tracked files total {total / 1e6:.1f} MB > "
      f"{MAX_TREE_BYTES / 1e6:.0f} MB; `git ls-files | xargs du -cb` lists "
      "them: move build state, logs and experiment outputs out of the tree")


def test_the_guard_sees_a_big_file_and_a_big_tree():
  big, total = oversized({"a.bin": MAX_FILE_BYTES + 1, "b.py": 10})
  assert big == ["a.bin (25.0 MB)"] and total == MAX_FILE_BYTES + 11
  big, total = oversized({f"{i}.bin": MAX_FILE_BYTES for i in range(3)})
  assert not big and total > MAX_TREE_BYTES


def test_outside_a_checkout_it_says_so(tmp_path):
  if shutil.which("git") is None:
    pytest.skip("git is not installed")
  with pytest.raises(FileNotFoundError, match="not a git checkout"):
    tracked_sizes(str(tmp_path))
