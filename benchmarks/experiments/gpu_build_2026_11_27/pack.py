"""Packs the GPU build's outputs into <= 4 parts of 15 MiB under $OUT."""
import os, subprocess, sys, tarfile
W, O, OUT = sys.argv[1:4]
CAP = 58 * 2**20
files = []
for root in (O, W):
  for dp, _, fn in os.walk(root):
    if "xla_cache" in dp:
      continue
    for f in fn:
      if f == "pretrain_tokens.npz" or f.endswith(".lock"):
        continue
      files.append(os.path.join(dp, f))
def prio(p):
  sz = os.path.getsize(p)
  if p.startswith(O):
    return (0, sz)
  if sz < 4 * 2**20:
    return (1, sz)
  done = os.path.exists(os.path.join(os.path.dirname(p), "done.json"))
  if not done and p.endswith("train_state.npz"):
    return (2, sz)
  return (3, sz)
files.sort(key=prio)
tot, keep = 0, []
with open(os.path.join(OUT, "pack_list.txt"), "w") as f:
  for p in files:
    sz = os.path.getsize(p)
    ok = tot + sz <= CAP
    if ok:
      tot += sz; keep.append(p)
    f.write(f"{'KEEP' if ok else 'SKIP'} {sz} {p}\n")
with tarfile.open("/tmp/pack.tar", "w") as t:
  for p in keep:
    t.add(p)
subprocess.run(["split", "-b", "15M", "/tmp/pack.tar", os.path.join(OUT, "pack.tar.")], check=True)
print("packed", len(keep), "files,", tot, "bytes")
