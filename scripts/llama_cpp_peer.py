"""llama.cpp as a peer, through llama-cpp-py-sync (its C API over CFFI).

``llama-cpp-py-sync`` (extra 'peers') ships a prebuilt CPU libllama with
CFFI ABI-mode bindings of llama.h; no compiler and no 100-minute source
build. Its wheel says manylinux2014, but the bundled libraries ask for glibc
2.38 (four C23 parsing functions: ``__isoc23_strtol``, ``strtoul``,
``strtoull``, ``sscanf``). On an older glibc (Debian 12 has 2.36),
:func:`load_library` makes a compatible copy once, outside the installed
package: the copy's ``GLIBC_2.38`` requirement is marked weak
(``VER_FLG_WEAK``, so the loader does not refuse it) and a 4-function shim
(compiled with the system ``cc``) forwards those names to glibc's
``strtol`` / ``strtoul`` / ``strtoull`` / ``vsscanf`` (the C23 versions only
add ``0b`` binary literals, which llama.cpp does not parse). The package's
own files are never changed.

:class:`LlamaCpp` drives one model on one sequence: prompt prefill, greedy
decoding one token per ``llama_decode``, and prompt-lookup speculation with
the same n-gram rule as ``models.NgramModel`` (chain): draft ``gamma``
tokens, verify the block in ONE ``llama_decode`` call (logits of every
position), accept the longest greedy-agreeing prefix plus the verifier's
token, and drop the rejected positions from the KV cache
(``llama_memory_seq_rm``).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import struct
import subprocess

import numpy as np

_SHIM_C = r"""
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
long __isoc23_strtol(const char *s, char **e, int b) { return strtol(s, e, b); }
unsigned long __isoc23_strtoul(const char *s, char **e, int b) {
  return strtoul(s, e, b); }
unsigned long long __isoc23_strtoull(const char *s, char **e, int b) {
  return strtoull(s, e, b); }
int __isoc23_sscanf(const char *s, const char *f, ...) {
  va_list ap; va_start(ap, f); int r = vsscanf(s, f, ap); va_end(ap);
  return r; }
"""
_SHT_GNU_VERNEED = 0x6ffffffe
_VER_FLG_WEAK = 0x2


def weaken_version(path: str, version: bytes = b"GLIBC_2.38") -> int:
  """Marks ``version`` weak in the ELF file's version needs (in place).

  Returns:
    How many needs were marked.
  """
  with open(path, "rb") as f:
    data = bytearray(f.read())
  if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
    raise ValueError(f"{path} is not a 64-bit little-endian ELF file")
  shoff, = struct.unpack_from("<Q", data, 0x28)
  shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
  sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
              for i in range(shnum)]
  marked = 0
  for _, kind, _, _, off, _, link, count, _, _ in sections:
    if kind != _SHT_GNU_VERNEED:
      continue
    strings = sections[link][4]
    p = off
    for _ in range(count):  # Elf64_Verneed entries
      _, n_aux, _, aux, nxt = struct.unpack_from("<HHIII", data, p)
      a = p + aux
      for _ in range(n_aux):  # Elf64_Vernaux entries
        _, flags, _, name, anxt = struct.unpack_from("<IHHII", data, a)
        end = data.index(b"\0", strings + name)
        if bytes(data[strings + name:end]) == version:
          struct.pack_into("<H", data, a + 4, flags | _VER_FLG_WEAK)
          marked += 1
        a += anxt
      if not nxt:
        break
      p += nxt
  with open(path, "wb") as f:
    f.write(data)
  return marked


def _compat_copy(pkg_dir: str, cache_dir: str) -> str:
  """The compatible copy's libllama.so path (made once)."""
  import llama_cpp_py_sync  # pylint: disable=g-import-not-at-top
  out = os.path.join(cache_dir, llama_cpp_py_sync.__version__)
  lib = os.path.join(out, "libllama.so")
  shim = os.path.join(out, "libisoc23.so")
  if not (os.path.exists(lib) and os.path.exists(shim)):
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    for name in os.listdir(pkg_dir):
      if ".so" in name:
        shutil.copy(os.path.join(pkg_dir, name), os.path.join(tmp, name))
        weaken_version(os.path.join(tmp, name))
    with open(os.path.join(tmp, "isoc23.c"), "w") as f:
      f.write(_SHIM_C)
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
      raise RuntimeError("llama-cpp-py-sync's libllama needs glibc 2.38 and "
                         "no C compiler (cc) is here to build the 4-function "
                         "compatibility shim; install gcc or a newer glibc")
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o",
                    os.path.join(tmp, "libisoc23.so"),
                    os.path.join(tmp, "isoc23.c")], check=True)
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)
  ctypes.CDLL(shim, mode=ctypes.RTLD_GLOBAL)
  return lib


def load_library(cache_dir: str | None = None):
  """(ffi, lib, how) of llama-cpp-py-sync's libllama.

  ``how`` is 'as installed' or 'compat copy (glibc < 2.38)'. Raises
  ImportError when the package is not installed.
  """
  from llama_cpp_py_sync import _cffi_bindings as b  # pylint: disable=g-import-not-at-top
  try:
    return b.get_ffi(), b.get_lib(), "as installed"
  except RuntimeError as e:
    if "GLIBC_2.38" not in str(e):
      raise
  cache_dir = cache_dir or os.path.expanduser(
      "~/.cache/specdec_jax/llama_cpp_compat")
  lib = _compat_copy(os.path.dirname(b.__file__), cache_dir)
  ffi = b.get_ffi()
  return ffi, ffi.dlopen(lib), "compat copy (glibc < 2.38)"


def ngram_propose(context: list[int], ns=(3, 2, 1)) -> int:
  """The token after the most recent earlier occurrence of the context's last
  n tokens (n in ``ns``, longest first); the last token again without one
  (``models.NgramModel``'s rule)."""
  t = len(context)
  for n in sorted(ns, reverse=True):
    if t <= n:
      continue
    suffix = context[t - n:]
    for end in range(t - 1, n - 1, -1):  # occurrence context[end-n:end]
      if context[end - n:end] == suffix:
        return context[end]
  return context[-1]


class LlamaCpp:
  """One GGUF model in llama.cpp, one sequence at a time (batch 1).

  Args:
    path: the .gguf file.
    threads: CPU threads for decode and prefill.
    n_ctx: context length (prompt + output + one draft block).
    cache_dir: where a compat copy of the library goes if one is needed.
  """

  def __init__(self, path: str, threads: int = 2, n_ctx: int = 1024,
               cache_dir: str | None = None):
    self.ffi, self.lib, self.how = load_library(cache_dir)
    ffi, lib = self.ffi, self.lib
    self._quiet = ffi.callback(
        "void(enum ggml_log_level, const char *, void *)",
        lambda level, text, data: None)
    lib.llama_log_set(self._quiet, ffi.NULL)
    lib.llama_backend_init()
    self.model = lib.llama_model_load_from_file(
        path.encode(), lib.llama_model_default_params())
    if self.model == ffi.NULL:
      raise ValueError(f"llama.cpp could not load {path}")
    self.vocab = lib.llama_model_get_vocab(self.model)
    self.n_vocab = lib.llama_vocab_n_tokens(self.vocab)
    cp = lib.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = n_ctx, n_ctx, n_ctx
    cp.n_threads, cp.n_threads_batch = threads, threads
    self.ctx = lib.llama_init_from_model(self.model, cp)
    if self.ctx == ffi.NULL:
      raise ValueError("llama.cpp could not make a context")
    self.batch = lib.llama_batch_init(n_ctx, 0, 1)
    self.n_ctx = n_ctx
    self.threads = threads

  def close(self) -> None:
    self.lib.llama_batch_free(self.batch)
    self.lib.llama_free(self.ctx)
    self.lib.llama_model_free(self.model)

  def tokenize(self, text: str, bos: bool = True) -> list[int]:
    raw = text.encode()
    buf = self.ffi.new("llama_token[]", len(raw) + 8)
    n = self.lib.llama_tokenize(self.vocab, raw, len(raw), buf, len(raw) + 8,
                                bos, False)
    return [buf[i] for i in range(n)]

  def reset(self) -> None:
    """Empties the KV cache."""
    self.lib.llama_memory_clear(self.lib.llama_get_memory(self.ctx), True)

  def forward(self, tokens, pos0: int, all_logits: bool) -> np.ndarray:
    """Runs ``tokens`` at positions pos0.. in ONE llama_decode call.

    Returns:
      [len(tokens), vocab] float32 logits when ``all_logits``, else
      [1, vocab] (the last position's).
    """
    b, n = self.batch, len(tokens)
    if pos0 + n > self.n_ctx:
      raise ValueError(f"{pos0 + n} positions exceed n_ctx={self.n_ctx}")
    b.n_tokens = n
    for i, t in enumerate(tokens):
      b.token[i], b.pos[i], b.n_seq_id[i] = int(t), pos0 + i, 1
      b.seq_id[i][0] = 0
      b.logits[i] = 1 if all_logits or i == n - 1 else 0
    rc = self.lib.llama_decode(self.ctx, b)
    if rc != 0:
      raise RuntimeError(f"llama_decode returned {rc}")
    rows = range(n) if all_logits else [n - 1]
    return np.stack([np.frombuffer(self.ffi.buffer(
        self.lib.llama_get_logits_ith(self.ctx, i), 4 * self.n_vocab),
                                   np.float32).copy() for i in rows])

  def next_logits(self, prompt: list[int]) -> np.ndarray:
    """[vocab] logits after ``prompt`` (fresh cache)."""
    self.reset()
    return self.forward(prompt, 0, False)[0]

  def greedy(self, prompt: list[int], new_tokens: int) -> list[int]:
    """Target-only greedy decoding: one llama_decode per token."""
    self.reset()
    t = int(self.forward(prompt, 0, False)[0].argmax())
    out, pos = [t], len(prompt)
    while len(out) < new_tokens:
      t = int(self.forward([t], pos, False)[0].argmax())
      out.append(t)
      pos += 1
    return out

  def ngram_speculative(self, prompt: list[int], new_tokens: int,
                        gamma: int = 3, ns=(3, 2, 1)):
    """Prompt-lookup speculation, greedy (output == :meth:`greedy`).

    Returns:
      (tokens, stats) with stats {'drafted', 'accepted', 'calls'}.
    """
    self.reset()
    mem = self.lib.llama_get_memory(self.ctx)
    last = int(self.forward(prompt, 0, False)[0].argmax())
    ctx, out, pos = list(prompt) + [last], [last], len(prompt)
    drafted = accepted = calls = 0
    while len(out) < new_tokens:
      draft = []
      for _ in range(min(gamma, new_tokens - len(out))):
        draft.append(ngram_propose(ctx + draft, ns))
      # [last, d_1 .. d_g] at pos..: logits i predict the token after i.
      logits = self.forward([last] + draft, pos, True)
      calls += 1
      best = logits.argmax(-1)
      k = 0
      while k < len(draft) and draft[k] == best[k]:
        k += 1
      new = draft[:k] + [int(best[k])]
      drafted, accepted = drafted + len(draft), accepted + k
      pos += 1 + k  # the cache keeps last and the accepted drafts
      self.lib.llama_memory_seq_rm(mem, 0, pos, -1)
      out += new
      ctx += new
      last = new[-1]
    return out[:new_tokens], dict(drafted=drafted, accepted=accepted,
                                  calls=calls)
