"""The markdown report of scripts/bench_gemma3.py (results dict -> text)."""

from __future__ import annotations

# llama.cpp vs ours, next-token logits: the tolerance (see TOLERANCE_NOTE).
LLAMA_KL_TOLERANCE = 0.05  # nats, every prompt
LLAMA_REL_TOLERANCE = 0.10  # max |diff| / max |logit|, every prompt

TOLERANCE_NOTE = (
    "Tolerance for llama.cpp (set after a first look at 10 prompts, before "
    "this run; checked on every prompt): KL(ours || llama.cpp) <= {kl} nats and max |diff| <= {rel:.0%} "
    "of the largest |logit|, and top-1 equal unless our top-2 gap is below "
    "the max |diff|. Why not ~1e-4 as with HF: both sides read the same "
    "Q4_K/Q6_K weights, but llama.cpp multiplies them with activations "
    "quantized to 8 bits per 256-value block (Q8_K: each value rounded to "
    "max|x|/127 steps, ~0.4% of the block's largest value), keeps the KV "
    "cache in float16 and sums in another order, through 18 layers of 7 "
    "matmuls; we dequantize the weights exactly and compute in float32. A "
    "relative error of a few parts in a thousand per matmul compounds to a "
    "few percent of the logits (the max over 262,144 logits picks the "
    "worst); the distributions stay close (KL) and greedy continuations can part at a "
    "near-tie, after which the rows differ.")


def _pct(a, b) -> str:
  return f"{a / b:.2f}x" if b else "-"


def _agreement(r) -> list[str]:
  lines = ["## Agreement", ""]
  hf = r["logits"].get("hf")
  if hf:
    lines.append(
        f"- HF transformers (float32, the dequantized weights), next-token "
        f"logits on {hf['prompts']} prompts: max |diff| "
        f"{hf['max_abs_diff']:.2e} (median of per-prompt max "
        f"{hf['median_max_abs_diff']:.2e}); top-1 agrees on "
        f"{hf['top1_agree']}/{hf['prompts']}.")
    same = sum(row.get("hf_first_difference", 0) is None
               for row in r["rows"][:r["hf_prompts"]])
    lines.append(f"- HF greedy continuations ({r['new_tokens']} tokens): "
                 f"{same}/{r['hf_prompts']} rows identical token by token.")
  lc = r["logits"].get("llama_cpp")
  if lc:
    ok = (lc["max_kl"] <= LLAMA_KL_TOLERANCE and lc["max_rel_diff"] <=
          LLAMA_REL_TOLERANCE and lc["top1_explained"] == lc["prompts"])
    lines += [
        f"- llama.cpp ({r['llama_cpp']['package']}, the same GGUF file), "
        f"next-token logits on {lc['prompts']} prompts: max |diff| "
        f"{lc['max_abs_diff']:.3f} (median of per-prompt max "
        f"{lc['median_max_abs_diff']:.3f}; the largest |logit| is "
        f"~{lc['median_top_logit']:.0f}, so at most "
        f"{lc['max_rel_diff']:.1%} of it); KL(ours || llama.cpp) max "
        f"{lc['max_kl']:.4f}, median {lc['median_kl']:.4f} nats; top-1 "
        f"agrees on {lc['top1_agree']}/{lc['prompts']}. Within the "
        f"tolerance: **{'yes' if ok else 'NO'}**.",
        f"- llama.cpp's tokenizer gives our prompt ids on "
        f"{r['llama_cpp_same_prompt_ids']}/{lc['prompts']} prompts (both "
        "sides are fed our ids).",
    ]
    first = [row["llama_cpp_first_difference"] for row in r["rows"]]
    same = sum(f is None for f in first)
    parted = sorted(f for f in first if f is not None)
    lines.append(
        f"- llama.cpp greedy continuations ({r['new_tokens']} tokens, all "
        f"{len(first)} prompts): {same}/{len(first)} rows identical token "
        f"by token" + (f"; the others part at token {parted} (a near-tie "
                       f"flips, then the rest of the row follows)"
                       if parted else "") + ".")
    lines += ["", TOLERANCE_NOTE.format(kl=LLAMA_KL_TOLERANCE,
                                        rel=LLAMA_REL_TOLERANCE)]
  return lines + [""]


def _speed(r) -> list[str]:
  m = r["speed_median"]
  base = m["ours"]
  rows = [("specdec_jax target-only", "ours", None),
          ("specdec_jax n-gram chain (gamma 3)", "ours_ngram",
           "ours_ngram_acceptance"),
          ("specdec_jax n-gram tree (9 nodes, top-3 x 3 deep)",
           "ours_ngram_tree", "ours_ngram_tree_acceptance")]
  if "llama_cpp" in m:
    rows += [("llama.cpp target-only", "llama_cpp", None),
             ("llama.cpp n-gram chain (gamma 3, one llama_decode per block)",
              "llama_cpp_ngram", "llama_cpp_ngram_acceptance")]
  rows += [("HF greedy (float32)", "hf", None),
           ("HF prompt lookup (3 tokens)", "hf_prompt_lookup", None)]
  lines = [
      f"## Speed, batch 1, {r['new_tokens']} new tokens (prompt prefill "
      f"included)", "",
      f"Median over {len(r['speed'])} prompts ("
      + ", ".join(f"`{r['rows'][s['prompt']]['prompt'][:28]!r}...`"
                  for s in r["speed"]) + ") of each prompt's median over "
      f"{r['repeats']} timed calls (HF: one call; ours: after one "
      f"compiling call). {r['threads']} threads on every side (torch "
      f"set_num_threads, llama.cpp n_threads; XLA uses the machine's "
      f"{r['device'].split('(')[1].split()[0]} cores).", "",
      "| | tokens/s | vs our target-only | acceptance |", "|---|---|---|---|"]
  for name, key, acc in rows:
    lines.append(f"| {name} | {m[key]:.2f} | {_pct(m[key], base)} | "
                 f"{m[acc]:.2f} |" if acc else
                 f"| {name} | {m[key]:.2f} | {_pct(m[key], base)} | |")
  lines += ["", "Speculation vs the same side's target-only: ours n-gram "
            f"chain {_pct(m['ours_ngram'], base)}, tree "
            f"{_pct(m['ours_ngram_tree'], base)}"
            + (f"; llama.cpp n-gram {_pct(m['llama_cpp_ngram'], m['llama_cpp'])}"
               if "llama_cpp" in m else "")
            + f"; HF prompt lookup {_pct(m['hf_prompt_lookup'], m['hf'])}. "
            "Our speculative runs gave our target-only tokens (checked)"
            + "".join(
                f"; llama.cpp's n-gram run parted from its greedy run at "
                f"token {s['llama_cpp_ngram_first_difference']} of prompt "
                f"{s['prompt']} (llama.cpp is not batch-invariant: a "
                f"multi-token llama_decode takes another matmul path)"
                for s in r["speed"]
                if s.get("llama_cpp_ngram_first_difference") is not None)
            + ".", ""]
  return lines


def report(r, prompts) -> str:
  del prompts
  lc = r.get("llama_cpp")
  lines = [
      "# Gemma 3 270M (real weights): specdec_jax vs llama.cpp and HF "
      "transformers", "",
      f"Command: `{r.get('command', 'python scripts/bench_gemma3.py')}` "
      "(one run; every side back to back). Weights: the Q4_K_M GGUF of the `.[gemma3]` extra: ours "
      "dequantized to float32 once; HF `Gemma3ForCausalLM` (transformers "
      "5.23) holds exactly those weights; llama.cpp reads the GGUF file "
      f"itself. {r['device']}; load average "
      f"{r['load_average_start'][0]:.1f} at the start, "
      f"{r['load_average_end'][0]:.1f} at the end (a shared machine: "
      "absolute speeds are noisy, compare ratios).", ""]
  if lc:
    lines += [
        f"llama.cpp: {lc['package']}, prebuilt CPU library, driven through "
        f"its C API (llama_decode / llama_get_logits_ith / "
        f"llama_memory_seq_rm) by `scripts/llama_cpp_peer.py`; library "
        f"loaded: {lc['library']}.", ""]
  else:
    lines += [f"llama.cpp was not run: {r.get('llama_cpp_error') or 'off'} "
              "(`pip install -e '.[peers]'`; docs/gemma3.md).", ""]
  lines += _agreement(r) + _speed(r) + ["## Outputs (greedy)", ""]
  for row in r["rows"]:
    lines += [f"**Prompt:** `{row['prompt']!r}`", "",
              f"- ours: `{row['ours']!r}`"]
    for side, name in (("hf", "HF"), ("llama_cpp", "llama.cpp")):
      if side in row:
        first = row[f"{side}_first_difference"]
        lines.append(f"- {name}: same" if first is None else
                     f"- {name}: `{row[side]!r}` (first difference at "
                     f"token {first})")
    lines.append("")
  return "\n".join(lines) + "\n"
