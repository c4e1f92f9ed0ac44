"""scripts/bench_vs_hf.py: an in-process --smoke run on tiny random pairs.

Checks what the benchmark records, not how fast anything is: the configured
rows exist with positive tokens/s, greedy outputs of ours and HF target-only
are token-identical (HF parity of the decode loop), SpecDecode greedy equals
target-only greedy, HF's refusal of batched assisted generation is recorded,
and the JSON / markdown files say the same as the returned dict.
"""

import json
import math
import os
import sys

import pytest

from tests import load_script

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

GAMMA = 3  # --smoke sweeps gamma {3}: one spec_decode gamma in every table.
NUM_PROMPTS = 2  # hf_batch_error needs 2; both share one padded width.


def _load_script():
  """scripts/bench_vs_hf.py as a module (scripts/ is not a package)."""
  name = "bench_vs_hf_under_test"
  if name in sys.modules:
    return sys.modules[name]
  module = load_script("bench_vs_hf", name)
  return module


@pytest.fixture
def restore_torch_globals():
  """main() sets torch's thread count and transformers' log verbosity."""
  threads = torch.get_num_threads()
  verbosity = transformers.logging.get_verbosity()
  yield
  torch.set_num_threads(threads)
  transformers.logging.set_verbosity(verbosity)


def _expected_rows():
  """(impl, method, variant, sampling, batch) of every measured config."""
  g = f"gamma={GAMMA}"
  keys = set()
  for s in ("greedy", "sampled"):
    keys |= {("ours", "target_only", "", s, 1),
             ("ours", "spec_decode", g, s, 1),
             ("hf", "target_only", "", s, 1),
             ("hf", "assisted", f"constant-{GAMMA}", s, 1),
             ("hf", "assisted", "default", s, 1),
             ("hf", "assisted", f"heuristic-{GAMMA}", s, 1),
             ("ours", "target_only", "", s, 8),
             ("ours", "spec_decode", g, s, 8)}
  return keys


# ~50 s each on 2 busy cores (compiling ours' programs dominates); T5 is
# marked slow so that the file's unmarked part stays under a minute.
@pytest.mark.usefixtures("restore_torch_globals")
@pytest.mark.parametrize("family", [
    "gemma", pytest.param("t5", marks=pytest.mark.slow)])
def test_smoke_run_records_parity_rows_and_files(family, tmp_path):
  bvh = _load_script()
  out = str(tmp_path / "bvh")
  argv = ["--smoke", "--out", out, "--pairs", f"tiny_{family}",
          "--num_prompts", str(NUM_PROMPTS), "--gamma", str(GAMMA),
          "--batch", "8", "--torch_threads", "1",
          # '' keeps main() from switching on a persistent compilation cache
          # for the rest of this pytest process.
          "--compilation_cache_dir", ""]
  result = bvh.main(argv)

  # Both files, and the JSON is exactly the returned dict.
  assert os.path.isfile(out + ".json") and os.path.isfile(out + ".md")
  with open(out + ".json") as f:
    on_disk = json.load(f)
  assert on_disk == json.loads(json.dumps(result))
  assert result["smoke"] is True and result["repeats"] == 1
  assert result["gamma"] == GAMMA
  assert result["command"] == f"bench_vs_hf.main({argv!r})"
  assert [p["name"] for p in result["pairs"]] == [f"tiny_{family}"]
  p = result["pairs"][0]
  assert p["encoder_decoder"] is (family == "t5")
  assert p["prompts"]["count"] == NUM_PROMPTS
  assert p["max_new_tokens"] == 16
  assert p["torch_threads"] == 1 and p["torch_threads_calibration"] == {}
  assert p["best_gamma"] == GAMMA
  assert [r["gamma"] for r in p["gamma_sweep"]] == [GAMMA]
  expected_cls = ("T5ForConditionalGeneration" if family == "t5"
                  else "Gemma2ForCausalLM")
  assert p["models"]["hf_classes"] == [expected_cls, expected_cls]

  # Exactly the configured rows, each with a positive, finite tokens/s.
  rows = {(r["impl"], r["method"], r["variant"], r["sampling"], r["batch"]): r
          for r in p["rows"]}
  assert len(rows) == len(p["rows"]) == 16
  assert set(rows) == _expected_rows()
  for key, r in rows.items():
    assert len(r["tokens_per_s_runs"]) == 1, key
    assert r["tokens"] > 0, key
    assert 0 < r["tokens_per_s"] < math.inf, key
    assert 0 < r["tokens_per_cpu_s"] < math.inf, key
    assert r["tokens"] <= NUM_PROMPTS * p["max_new_tokens"], key
  g = f"gamma={GAMMA}"
  for b in (1, 8):
    spec = rows["ours", "spec_decode", g, "greedy", b]
    assert 0 <= spec["accepted"] <= spec["drafted"]
    assert spec["verifier_calls"] <= spec["tokens"] <= (
        spec["verifier_calls"] * (GAMMA + 1))
  for impl in ("ours", "hf"):  # Target-only: one verifier call per token.
    r = rows[impl, "target_only", "", "greedy", 1]
    assert r["verifier_calls"] == r["tokens"]
  # Same greedy tokens everywhere; request ids make samples batch-independent.
  greedy = {r["tokens"] for k, r in rows.items() if k[3] == "greedy"}
  assert len(greedy) == 1
  for method, variant in (("target_only", ""), ("spec_decode", g)):
    b1 = rows["ours", method, variant, "sampled", 1]
    b8 = rows["ours", method, variant, "sampled", 8]
    for k in ("tokens", "verifier_calls", "drafted", "accepted"):
      assert b1[k] == b8[k], (method, k)

  # Greedy outputs, token for token.
  ident = p["identity"]
  all_same = dict(identical=NUM_PROMPTS, total=NUM_PROMPTS,
                  all_identical=True, diverged=[])
  assert ident["target_only: ours vs hf"] == all_same
  ours_ref = "ours target_only greedy b1"
  hf_ref = "hf target_only greedy b1"
  assert ident[f"ours spec_decode[{g}] greedy b1 vs {ours_ref}"] == all_same
  assert ident[f"ours spec_decode[{g}] greedy b8 vs {ours_ref}"] == all_same
  for v in (f"constant-{GAMMA}", "default", f"heuristic-{GAMMA}"):
    assert ident[f"hf assisted[{v}] greedy b1 vs {hf_ref}"] == all_same
  batch_error = ident["hf batch-2 assisted generation"]
  assert isinstance(batch_error, str) and batch_error
  assert not batch_error.startswith("(no error"), batch_error
  assert "batch" in batch_error.lower(), batch_error
  assert batch_error.split(":")[0].endswith("Error"), batch_error

  # Ratios and speedups are the recorded tokens/s divided.
  ratio = {(r["sampling"], r["what"]): r["ours_over_hf"] for r in p["ratios"]}
  for s in ("greedy", "sampled"):
    assert ratio[s, "target_only"] == pytest.approx(
        rows["ours", "target_only", "", s, 1]["tokens_per_s"]
        / rows["hf", "target_only", "", s, 1]["tokens_per_s"])
    assert p["goal"][s]["target_only_ratio"] == pytest.approx(
        ratio[s, "target_only"])
  speedups = {(x["impl"], x["variant"], x["sampling"], x["batch"]):
              x["speedup"] for x in p["speedups"]}
  assert len(speedups) == 10  # every non-target-only row
  assert speedups["ours", g, "greedy", 8] == pytest.approx(
      rows["ours", "spec_decode", g, "greedy", 8]["tokens_per_s"]
      / rows["ours", "target_only", "", "greedy", 8]["tokens_per_s"])

  # The markdown: command line, the tables and the parity lines.
  with open(out + ".md") as f:
    md = f.read()
  assert md == bvh.markdown(result)
  assert f"Command: `bench_vs_hf.main({argv!r})`" in md
  assert f"## tiny_{family}" in md
  for header in ("| impl | method | variant | sampling | batch | tokens/s |",
                 "| impl | variant | sampling | batch | speedup |",
                 "| sampling | comparison | ours / HF |"):
    assert header in md
  for r in p["rows"]:
    assert (f"| {r['impl']} | {r['method']} | {r['variant'] or '-'} | "
            f"{r['sampling']} | {r['batch']} | {r['tokens_per_s']:.1f} | "
            in md)
  assert (f"* target_only: ours vs hf: {NUM_PROMPTS}/{NUM_PROMPTS} identical"
          in md)
  assert f"* hf batch-2 assisted generation: `{batch_error}`" in md
