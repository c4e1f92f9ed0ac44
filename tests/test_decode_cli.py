"""`specdec_jax decode`: checks before any model loads, streamed rows, resume.

Tiny random Gemma models (gin/pairs/tiny_random.gin, vocabulary 64). Most
tests run the console entry point in this process (``main.cli``) so the
compiled decode programs are shared; the kill test runs a real subprocess.
"""

import fcntl
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

from absl import flags
import gin
import pytest

from specdec_jax import main, runs

BASE = ["decode", "--gin_file=runs/decode.gin",
        "--gin_file=pairs/tiny_random.gin", "--gin.MAX_NEW_TOKENS=4",
        "--gin.GAMMA=2", "--gin.BATCH_SIZE=2"]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cli(capsys, *args):
  """Runs ``specdec_jax *args`` in-process: (exit status, stdout, stderr)."""
  flags.FLAGS.unparse_flags()
  gin.clear_config()
  code = 0
  try:
    main.cli(["specdec_jax", *args])
  except SystemExit as e:
    code = e.code or 0
  finally:
    gin.clear_config()
  out = capsys.readouterr()
  return code, out.out, out.err


def errors(err):
  return [ln for ln in err.splitlines() if ln.startswith("specdec_jax: error")]


def write_requests(path, token_rows):
  path.write_text("".join(json.dumps({"tokens": t}) + "\n"
                          for t in token_rows))
  return str(path)


def rows_of(path):
  with open(path) as f:
    return [json.loads(line) for line in f]


@pytest.fixture
def no_model_loads(monkeypatch):
  """Fails the test if any ModelSpec loads weights."""
  def fail(self):
    raise AssertionError(f"the {self.role} was loaded")
  monkeypatch.setattr(runs.ModelSpec, "load", fail)


def test_good_rows_are_written_when_one_request_is_bad_then_resumed(
    tmp_path, capsys):
  req = write_requests(tmp_path / "req.jsonl",
                       [[2, 5, 9], [2, 7], [2, 11, 12, 13], [2, 99]])
  out = tmp_path / "out"
  code, _, err = cli(capsys, *BASE, f"--gin.INPUT_FILE='{req}'",
                     f"--gin.OUTPUT_DIR='{out}'")
  assert code == 2
  assert errors(err) == [
      f"specdec_jax: error: {req}:4 (request '3'): token id 99 at position 1 "
      f"is outside the vocabulary [0, 64)"]
  assert (f"specdec_jax: 1 of 4 requests were invalid and not decoded (the "
          f"other 3 are in {out}/decodes.jsonl; fix them and rerun the same "
          f"command: finished rows are kept and only the missing requests are "
          f"decoded)") in err
  first = rows_of(out / "decodes.jsonl")
  assert [r["id"] for r in first] == ["0", "1", "2"]
  assert [r["num_tokens"] for r in first] == [4, 4, 4]
  # Fix the bad line and rerun: only request 3 is decoded.
  write_requests(tmp_path / "req.jsonl",
                 [[2, 5, 9], [2, 7], [2, 11, 12, 13], [2, 9]])
  code, _, err = cli(capsys, *BASE, f"--gin.INPUT_FILE='{req}'",
                     f"--gin.OUTPUT_DIR='{out}'")
  assert code == 0, err
  rows = rows_of(out / "decodes.jsonl")
  assert rows[:3] == first
  assert [r["id"] for r in rows] == ["0", "1", "2", "3"]
  table = [ln.split() for ln in err.splitlines() if ln[:1].isdigit()]
  assert table[-1][:4] == ["4", "1", "3", "0"]  # requests written resumed failed


def test_resume_after_deleting_a_bad_line_as_advised_gives_correct_rows(
    tmp_path, capsys):
  """Issue 43: rows are matched by request content, never by position."""
  sampled = [*BASE, "--gin.TEMPERATURE=1.0", "--gin.SEED=3"]
  good = [[2, 5, 9], [2, 11, 12, 13], [2, 7, 7]]
  req = write_requests(tmp_path / "req.jsonl", [good[0], [2, 99], *good[1:]])
  out = tmp_path / "out"
  args = [*sampled, f"--gin.INPUT_FILE='{req}'", f"--gin.OUTPUT_DIR='{out}'"]
  code, _, err = cli(capsys, *args)
  assert code == 2 and "fix them and rerun the same command" in err
  write_requests(tmp_path / "req.jsonl", good)  # delete line 2, as advised
  code, _, err = cli(capsys, *args)
  assert code == 0, err
  ref_req = write_requests(tmp_path / "ref.jsonl", good)
  assert cli(capsys, *sampled, f"--gin.INPUT_FILE='{ref_req}'",
             f"--gin.OUTPUT_DIR='{tmp_path / 'ref'}'")[0] == 0
  strip = lambda r: {k: v for k, v in r.items() if k != "batch_seconds"}
  ref = [strip(r) for r in rows_of(tmp_path / "ref" / "decodes.jsonl")]
  rows = [strip(r) for r in rows_of(out / "decodes.jsonl")]
  assert rows == ref and [r["id"] for r in rows] == ["0", "1", "2"]
  # Edit a decoded request: its stale row is replaced, the others are kept.
  edited = [good[0], [2, 11, 12], good[2]]
  write_requests(tmp_path / "req.jsonl", edited)
  code, _, err = cli(capsys, *args)
  assert code == 0, err
  rows = rows_of(out / "decodes.jsonl")
  assert len(rows) == 3 and sorted(r["id"] for r in rows) == ["0", "1", "2"]
  one = {r["id"]: r for r in rows}["1"]
  assert one["input_tokens"] == 3 and one["line"] == 2
  table = [ln.split() for ln in err.splitlines() if ln[:1].isdigit()]
  assert table[-1][:4] == ["3", "1", "2", "0"]  # written resumed failed


@pytest.mark.parametrize("bindings,message", [
    (["--gin.GAMMA=0"], "gamma must be an integer in [1, 1024], got 0"),
    (["--gin.SEED=-1"], "seed must be an integer in [0, 2**32), got -1 "
     "(negative seeds are not accepted: they would wrap around)"),
    (["--gin.MAX_NEW_TOKENS=2147483648"], "max_new_tokens must be an integer "
     "in [1, 2**31 - 1), got 2147483648"),
    (["--gin.MAX_NEW_TOKENS=1000000000000"], "max_new_tokens must be an "
     "integer in [1, 2**31 - 1), got 1000000000000"),
    (["--gin.MAX_NEW_TOKENS=2147483640"], "max_new_tokens=2147483640 is too "
     "large: prompt (16) + max_new_tokens + gamma + 2 = 2147483660 cache "
     "positions, more than int32 positions allow (2**31 - 1)"),
    (["--gin.MAX_NEW_TOKENS=1000000000"], "max_new_tokens=1000000000 with "
     "batch 1 needs 357.6 GiB for the parameters and KV caches (1000000020 "
     "cache slots per row) but the host memory is"),
    (["--gin.BATCH_SIZE=0"], "batch_size must be an integer >= 1, got 0"),
    (["--gin.GAMMA=2.0"], "gamma must be an integer in [1, 1024], got 2.0"),
    (["--gin.TEMPERATURE=-1.0"], "temperature must be a finite number >= 0 "
     "(0 = greedy), got -1.0"),
    (["--gin_file=methods/token_v3.gin", "--gin.ALPHA=1.5"],
     "TokenV3 alpha must be in [0.0, 1.0], got 1.5"),
    (["--gin_file=methods/bild.gin", "--gin.TEMPERATURE=0.5"],
     "BiLD is a greedy method (temperature 0 only); set TEMPERATURE = 0"),
    (["--gin.tiny_verifier/ModelSpec.max_input_tokens=1"], "the verifier's "
     "ModelSpec: max_input_tokens must be an integer >= 2 or None, got 1"),
    (["--gin.tiny_drafter/ModelSpec.preset='gemma_huge'"], "the drafter's "
     "ModelSpec: unknown preset 'gemma_huge'"),
])
def test_values_are_checked_before_models_load(tmp_path, capsys,
                                               no_model_loads, bindings,
                                               message):
  req = write_requests(tmp_path / "req.jsonl", [[2, 5]])
  code, _, err = cli(capsys, *BASE, f"--gin.INPUT_FILE='{req}'", *bindings)
  assert code == 2
  assert len(errors(err)) == 1 and message in errors(err)[0], err
  assert "Traceback" not in err


def test_output_location_is_checked_before_models_load(tmp_path, capsys,
                                                       no_model_loads):
  req = write_requests(tmp_path / "req.jsonl", [[2, 5]])
  args = [*BASE, f"--gin.INPUT_FILE='{req}'"]
  a_file = tmp_path / "file"
  a_file.write_text("x")
  code, _, err = cli(capsys, *args, f"--gin.OUTPUT_DIR='{a_file}/sub'")
  assert code == 2 and errors(err) == [
      f"specdec_jax: error: ValueError: cannot write {a_file}/sub/"
      f"decodes.jsonl: {a_file} is a file, not a directory; choose another "
      f"OUTPUT_DIR"]
  (tmp_path / "d" / "decodes.jsonl").mkdir(parents=True)
  code, _, err = cli(capsys, *args, f"--gin.OUTPUT_DIR='{tmp_path / 'd'}'")
  assert code == 2 and errors(err) == [
      f"specdec_jax: error: ValueError: cannot write {tmp_path}/d/"
      f"decodes.jsonl: it is a directory"]
  if os.geteuid() == 0:  # root ignores permission bits; sysfs refuses mkdir
    readonly = "/sys/specdec_jax_test_output"
  else:
    (tmp_path / "ro").mkdir(mode=0o500)
    readonly = str(tmp_path / "ro" / "out")
  code, _, err = cli(capsys, *args, f"--gin.OUTPUT_DIR='{readonly}'")
  assert code == 2 and len(errors(err)) == 1
  assert f"cannot write {readonly}/decodes.jsonl: " in err
  assert "check the directory's permissions" in err


def test_a_second_decode_on_the_same_output_is_refused(tmp_path, capsys,
                                                       no_model_loads):
  req = write_requests(tmp_path / "req.jsonl", [[2, 5]])
  out = tmp_path / "out"
  out.mkdir()
  with open(out / "decodes.jsonl", "a") as held:  # another decode's lock
    fcntl.flock(held, fcntl.LOCK_EX)
    code, _, err = cli(capsys, *BASE, f"--gin.INPUT_FILE='{req}'",
                       f"--gin.OUTPUT_DIR='{out}'")
  assert code == 2 and errors(err) == [
      f"specdec_jax: error: ValueError: {out}/decodes.jsonl is being written "
      f"by another decode (it is locked); wait for it to finish or choose "
      f"another OUTPUT_DIR"]


def test_resume_refuses_other_settings_and_repairs_a_torn_line(
    tmp_path, capsys, monkeypatch):
  req = write_requests(tmp_path / "req.jsonl", [[2, 5], [2, 6]])
  out = tmp_path / "out"
  args = [*BASE, f"--gin.INPUT_FILE='{req}'", f"--gin.OUTPUT_DIR='{out}'"]
  assert cli(capsys, *args)[0] == 0
  rows = rows_of(out / "decodes.jsonl")
  monkeypatch.setattr(runs.ModelSpec, "load", lambda self: 1 / 0)
  code, _, err = cli(capsys, *args, "--gin.GAMMA=3")
  assert code == 2 and errors(err) == [
      f"specdec_jax: error: ValueError: {out}/decodes.jsonl holds 2 row(s) "
      f"decoded with other settings (differing: gamma); a decode resumes "
      f"only with the same settings: choose another OUTPUT_DIR or delete the "
      f"file"]
  with open(out / "decodes.jsonl", "a") as f:
    f.write('{"key": "2", "id": "2", "tok')  # a writer killed mid-line
  with pytest.warns(UserWarning, match="dropping a torn last line"):
    code, _, err = cli(capsys, *args)
  assert code == 0, err
  assert rows_of(out / "decodes.jsonl") == rows  # nothing decoded again


def test_long_prompt_is_cut_with_a_warning_like_eval(tmp_path, capsys):
  long_row = [2] + list(range(10, 19))  # 10 tokens
  req = write_requests(tmp_path / "req.jsonl", [long_row])
  code, _, err = cli(capsys, *BASE, f"--gin.INPUT_FILE='{req}'",
                     f"--gin.OUTPUT_DIR='{tmp_path / 'a'}'",
                     "--gin.tiny_verifier/ModelSpec.max_input_tokens=4")
  assert code == 0, err
  assert (f"specdec_jax: warning: {req}:1 (request '0') has 10 input tokens, "
          f"more than the verifier's max_input_tokens (4); it is cut to 4"
          ) in err
  (row,) = rows_of(tmp_path / "a" / "decodes.jsonl")
  assert row["input_tokens"] == 10 and row["input_truncated"]
  cut = write_requests(tmp_path / "cut.jsonl", [[2, 16, 17, 18]])
  code, _, err = cli(capsys, *BASE, f"--gin.INPUT_FILE='{cut}'",
                     f"--gin.OUTPUT_DIR='{tmp_path / 'b'}'")
  assert code == 0, err
  (ref,) = rows_of(tmp_path / "b" / "decodes.jsonl")
  assert row["tokens"] == ref["tokens"] and not ref["input_truncated"]


_SLOW_CLI = textwrap.dedent("""
    import sys, time
    from specdec_jax import decoding, main
    generate = decoding.generate
    def slow(*args, **kwargs):
      out = generate(*args, **kwargs)
      time.sleep(0.7)
      return out
    decoding.generate = slow
    main.cli(["specdec_jax", *sys.argv[1:]])
""")


def test_sigkill_mid_run_then_resume_loses_and_duplicates_nothing(
    tmp_path, capsys):
  tokens = [[2, 5 + i, 9 + i % 3] for i in range(10)]
  req = write_requests(tmp_path / "req.jsonl", tokens)
  args = [*BASE, f"--gin.INPUT_FILE='{req}'", "--gin.TEMPERATURE=1.0",
          "--gin.SEED=7"]
  assert cli(capsys, *args, f"--gin.OUTPUT_DIR='{tmp_path / 'ref'}'")[0] == 0
  ref = rows_of(tmp_path / "ref" / "decodes.jsonl")
  out = tmp_path / "out" / "decodes.jsonl"
  proc = subprocess.Popen(
      [sys.executable, "-c", _SLOW_CLI, *args,
       f"--gin.OUTPUT_DIR='{tmp_path / 'out'}'"], cwd=ROOT,
      env=dict(os.environ, JAX_PLATFORMS="cpu"), stdout=subprocess.DEVNULL,
      stderr=subprocess.PIPE)
  deadline = time.time() + 240
  while time.time() < deadline and proc.poll() is None:
    if out.exists() and out.read_bytes().count(b"\n") >= 4:
      break
    time.sleep(0.05)
  assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  killed = out.read_bytes().count(b"\n")
  assert 4 <= killed < 10
  code, _, err = cli(capsys, *args, f"--gin.OUTPUT_DIR='{tmp_path / 'out'}'")
  assert code == 0, err
  rows = rows_of(out)
  assert [r["id"] for r in rows] == [str(i) for i in range(10)]
  strip = lambda r: {k: v for k, v in r.items() if k != "batch_seconds"}
  assert [strip(r) for r in rows] == [strip(r) for r in ref]
  table = [ln.split() for ln in err.splitlines() if ln[:1].isdigit()]
  assert table[-1][:4] == ["10", str(10 - killed), str(killed), "0"]


class _FakeTok:
  """One id per character (10 + ord % 50) with the Tokenizer's conventions:
  Gemma (BOS 2 added by default) or T5 (no BOS); EOS 1."""
  eos_id = 1

  def __init__(self, gemma: bool):
    self.bos_id = 2 if gemma else None

  def encode(self, text, add_bos=None, add_eos=False):
    ids = [10 + ord(c) % 50 for c in text]
    bos = self.bos_id is not None if add_bos is None else add_bos
    return ([self.bos_id] if bos else []) + ids + (
        [self.eos_id] if add_eos else [])


@pytest.mark.parametrize("encdec,want", [(True, [[11, 12, 13, 1], [11, 1]]),
                                         (False, [[2, 15, 16, 17], [2, 11]])])
def test_eval_cuts_long_inputs_like_decode(capsys, encdec, want):
  verifier = type("V", (), {"is_encoder_decoder": encdec})()
  pair = runs.LoadedPair("p", None, verifier, None, None,
                         _FakeTok(gemma=not encdec), ("bleu",), 8,
                         max_input_tokens=4)
  examples = [{"id": "a", "inputs": "\x01\x02\x03\x04\x05\x06\x07"},
              {"id": "b", "inputs": "\x01"}]
  assert runs.warn_long_inputs(pair, examples) == 1
  assert capsys.readouterr().err == (
      "specdec_jax: warning: 1 of 2 examples have more than 4 input tokens "
      "(the verifier's max_input_tokens) and are cut to it, as decode cuts "
      "long requests\n")
  key = "inputs" if encdec else "prompts"
  assert pair.encode(examples) == {key: want}
