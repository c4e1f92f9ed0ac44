r"""Serving benchmark: the HTTP server under a bounded loopback load.

For each built-in family, each concurrency C and each speculation mode
(off = target only, chain, auto), N requests (the family's test prompts, as
token ids) go through the real server (uvicorn on 127.0.0.1) from C
concurrent streaming clients; we record time to first token (TTFT),
inter-token latency (ITL: the gap between token-carrying SSE chunks divided
by their tokens) and throughput (generated tokens / wall time). The
reference is ``decoding.generate`` of the same requests offline, in batches
of C. ``auto`` is refused by the server until the planner issue lands (the
row records the 400). Ratios are measured back to back in one run.

    python scripts/bench_serve.py --out benchmarks/results/bench_serve
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import threading
import time

import httpx
import numpy as np
import uvicorn

from specdec_jax import decoding
from specdec_jax.families import loader as default_models
from specdec_jax.serving import cli


def _port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


async def _one(client, url, body, rec):
  t0 = time.perf_counter()
  last, ttft, gaps, n = t0, None, [], 0
  async with client.stream("POST", url, json=body) as r:
    if r.status_code != 200:
      rec.append({"status": r.status_code, "error": (await r.aread())[:200]
                  .decode()})
      return
    async for line in r.aiter_lines():
      if not line.startswith("data: ") or line == "data: [DONE]":
        continue
      chunk = json.loads(line[6:])
      if "error" in chunk:
        rec.append({"status": chunk["error"]["code"],
                    "error": chunk["error"]["message"]})
        return
      k = len(chunk["choices"][0].get("token_ids", []))
      if not k:
        continue
      now = time.perf_counter()
      if ttft is None:
        ttft = now - t0
      else:
        gaps += [(now - last) / k] * k
      last, n = now, n + k
  rec.append({"status": 200, "ttft": ttft, "gaps": gaps, "tokens": n})


async def _load(url, bodies, conc):
  sem, rec = asyncio.Semaphore(conc), []
  async with httpx.AsyncClient(timeout=600) as client:
    async def run(b):
      async with sem:
        await _one(client, url, b, rec)
    t0 = time.perf_counter()
    await asyncio.gather(*(run(b) for b in bodies))
    wall = time.perf_counter() - t0
  return rec, wall


def _summary(rec, wall):
  ok = [r for r in rec if r["status"] == 200]
  if not ok:
    return {"status": rec[0]["status"], "error": rec[0].get("error")}
  gaps = [g for r in ok for g in r["gaps"]]
  toks = sum(r["tokens"] for r in ok)
  return {"requests": len(ok), "tokens": toks, "wall_s": wall,
          "tok_per_s": toks / wall,
          "ttft_p50_s": statistics.median(r["ttft"] for r in ok),
          "ttft_p90_s": float(np.percentile([r["ttft"] for r in ok], 90)),
          "itl_p50_s": statistics.median(gaps) if gaps else None,
          "itl_p90_s": float(np.percentile(gaps, 90)) if gaps else None}


def _offline(pair, rows, conc, max_tokens, gamma, mode):
  method = (decoding.TargetOnly() if mode == "off" else
            decoding.make_method("spec_decode"))
  key = "inputs" if pair.is_encoder_decoder else "prompts"
  calls = [rows[i:i + conc] for i in range(0, len(rows), conc)]
  run = lambda c: decoding.generate(
      method, pair.drafter, pair.verifier, pair.q_params, pair.p_params,
      **{key: c}, gamma=gamma, max_new_tokens=max_tokens, seeds=0,
      pad_to=48)  # the server's slot width: one compile
  run(calls[0])  # compile
  t0, toks = time.perf_counter(), 0
  for c in calls:
    toks += int(run(c).lengths.sum())
  wall = time.perf_counter() - t0
  return {"tokens": toks, "wall_s": wall, "tok_per_s": toks / wall}


def bench_family(name, concurrency, n, max_tokens, gamma, slots):
  pair = default_models.load(name)
  exs = default_models.examples(name, "test", limit=n)
  rows = next(iter(pair.encode(exs).values()))
  rows = [r[-48:] if not pair.is_encoder_decoder else r[:48] for r in rows]
  port = _port()
  app = cli.build_app(pair.levels(), None, model=name, slots=slots,
                      max_prompt=48, max_tokens=max_tokens, steps=2,
                      max_queue=4 * n, gamma=gamma, max_pools=4,
                      request_timeout_s=3600.0)
  server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                         log_level="warning"))
  th = threading.Thread(target=server.run, daemon=True)
  th.start()
  while not server.started:
    time.sleep(0.1)
  url = f"http://127.0.0.1:{port}/v1/completions"
  body = lambda r, mode: {"prompt": [int(t) for t in r],
                          "max_tokens": max_tokens, "temperature": 0.0,
                          "seed": 0, "stream": True, "speculation": mode}
  out = []
  for mode in ("off", f"chain:{gamma}"):  # warm-up: every sub-batch size
    for conc in sorted(set(concurrency) | {1, 2}, reverse=True):
      asyncio.run(_load(url, [body(r, mode) for r in rows[:2 * conc]], conc))
  for conc in concurrency:
    for mode in ("off", f"chain:{gamma}", "auto"):
      rec, wall = asyncio.run(_load(url, [body(r, mode) for r in rows],
                                    conc))
      s = _summary(rec, wall)
      if mode != "auto":
        s["offline"] = _offline(pair, rows, conc, max_tokens, gamma,
                                "off" if mode == "off" else "chain")
        s["serve_over_offline"] = s["tok_per_s"] / s["offline"]["tok_per_s"]
      out.append({"family": name, "concurrency": conc, "speculation": mode,
                  **s})
      print(json.dumps(out[-1]), flush=True)
  server.should_exit = True
  th.join(timeout=30)
  return out


def write(rows, path, cmd):
  load = os.getloadavg()
  with open(path + ".json", "w") as f:
    json.dump({"command": cmd, "loadavg": load, "rows": rows}, f, indent=1)
  lines = [f"# bench_serve\n\nCommand: `{cmd}`  \nLoad average at the end: "
           f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (2 shared CPU "
           f"cores; absolute times are noisy, compare ratios).\n",
           "| family | C | speculation | tok/s | offline tok/s | serve/offline "
           "| chain/off (serve) | TTFT p50 s | ITL p50 s |",
           "|---|---|---|---|---|---|---|---|---|"]
  base = {(r["family"], r["concurrency"]): r.get("tok_per_s") for r in rows
          if r["speculation"] == "off"}
  for r in rows:
    if "tok_per_s" not in r:
      lines.append(f"| {r['family']} | {r['concurrency']} | "
                   f"{r['speculation']} | refused ({r['status']}) | | | | | |")
      continue
    ratio = r["tok_per_s"] / base[(r["family"], r["concurrency"])]
    itl = r["itl_p50_s"]
    lines.append(
        f"| {r['family']} | {r['concurrency']} | {r['speculation']} | "
        f"{r['tok_per_s']:.1f} | {r['offline']['tok_per_s']:.1f} | "
        f"{r['serve_over_offline']:.2f} | {ratio:.2f} | "
        f"{r['ttft_p50_s']:.3f} | {'-' if itl is None else f'{itl:.4f}'} |")
  with open(path + ".md", "w") as f:
    f.write("\n".join(lines) + "\n")


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--families", default="gemma_completion,t5_codegen")
  ap.add_argument("--concurrency", default="1,4,16")
  ap.add_argument("--requests", type=int, default=16)
  ap.add_argument("--max_tokens", type=int, default=32)
  ap.add_argument("--gamma", type=int, default=4)
  ap.add_argument("--slots", type=int, default=16)
  ap.add_argument("--out", default="benchmarks/results/bench_serve")
  a = ap.parse_args()
  conc = [int(c) for c in a.concurrency.split(",")]
  rows = []
  for fam in a.families.split(","):
    rows += bench_family(fam, conc, a.requests, a.max_tokens, a.gamma,
                         a.slots)
    write(rows, a.out, "python scripts/bench_serve.py " + " ".join(
        f"--{k}={v}" for k, v in vars(a).items()))


if __name__ == "__main__":
  main()
