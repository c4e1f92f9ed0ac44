"""Experiment (issue 15, choice of the next T5 task; run from the repo root
with the .venv-test python; paths are the 2026-11 build machine's):

    LEVEL=small|large python benchmarks/experiments/t5_codegen_check.py WORKDIR STEPS LR EVAL_EVERY

Does the T5 family order by size on text-to-code (the Gemma task's
functions as a sequence-to-sequence problem: inputs = signature +
docstring, targets = the first body lines, metric BLEU)? Fine-tunes the
third build's pretrained T5 model of LEVEL (50/50 prefix-LM + docstring
pairs pretraining) on the stdlib training split of that task; resumable;
every EVAL_EVERY steps: validation loss, shuffled-input loss (the input
gap), greedy BLEU and loop rate on 96 validation examples."""
import dataclasses, json, os, sys, time
sys.path.insert(0, "/work/main"); sys.path.insert(0, "/work/main/scripts")
import jax, numpy as np
from specdec_jax import decoding, train as train_lib, tokenizer as tokenizer_lib
from specdec_jax.eval import default_models as dm, default_models_eval as dme
from specdec_jax.eval import corpus as corpus_lib
from specdec_jax.models import model_from_config
import train_default_models as tdm
import default_models_plan as plan

WD = sys.argv[1]; STEPS = int(sys.argv[2]); LR = float(sys.argv[3]); EVAL = int(sys.argv[4])
LEVEL = os.environ.get("LEVEL", "large")
os.makedirs(WD, exist_ok=True)
t5 = "t5_docstring"
INIT = f"/work/dm_work3/{t5}/{LEVEL}_pretrain/final_params.npz"
tok = tokenizer_lib.Tokenizer(f"/work/dm_out3/{t5}/tokenizer.model", "t5", extra_ids=0)
spec = dataclasses.replace(dm.TASKS["gemma_completion"], name=t5, family="t5",
                           vocab_size=dm.TASKS[t5].vocab_size)
ex = corpus_lib.default_corpus().examples["gemma_completion"]
train_rows = dme.tokenize(tok, spec, ex["train"])
val_rows = dme.tokenize(tok, spec, ex["validation"])
print("train rows", len(train_rows), "val", len(val_rows), flush=True)
perm = np.random.default_rng(0).permutation(len(val_rows))
shuf = [(val_rows[perm[i]][0], val_rows[i][1]) for i in range(len(val_rows))]
m = model_from_config(plan.arch(t5, LEVEL, tok))
params = tdm._load_npz_params(INIT, m)
cfg = train_lib.TrainConfig(steps=STEPS, learning_rate=LR, warmup_steps=min(50, STEPS - 1),
                            eval_every=EVAL, seed=41)
state = train_lib.init_state(params, cfg)
hist = []
r = train_lib.restore_state(WD, state)
if r is not None:
  state, _, _, hist = r
start = int(state.step)
print("start", start, flush=True)
step_fn = train_lib.make_train_step(m, cfg)
make = dme.batch_maker(spec, tok.eos_id, 0.0)
stream = train_lib.bucketed_stream(train_rows, make, 32, lambda r: len(r[0]) + len(r[1]),
                                   seed=123, start_step=start)
exs = ex["validation"][:96]
t0 = time.time()
for i, batch in zip(range(start, STEPS), stream):
  state, met = step_fn(state, batch)
  if (i + 1) % 50 == 0:
    print(i + 1, "loss", float(met["loss"]), f"{time.time()-t0:.0f}s", flush=True)
  if (i + 1) % EVAL == 0 or i + 1 == STEPS:
    p32 = jax.device_get(state.params)
    p = tdm.to_bf16(p32)
    pair = dm.DefaultPair(t5, m, m, p, p, tok, ("bleu",), spec.max_new_tokens, True, spec)
    preds, _ = dme.decode(pair, decoding.make_method("target_only"), exs, verifier="large")
    q = dme.quality(pair, exs, preds)
    q["val_loss"] = round(dme.heldout_loss(m, p32, val_rows, make), 4)
    q["shuffled_loss"] = round(dme.heldout_loss(m, p32, shuf, make), 4)
    q["step"] = i + 1; q["time"] = time.strftime("%H:%M:%S"); q["sample"] = preds[:3]
    hist.append(q)
    train_lib.save_state(WD, state, i + 1, q["val_loss"], hist)
    print("EVAL", json.dumps(q), flush=True)
