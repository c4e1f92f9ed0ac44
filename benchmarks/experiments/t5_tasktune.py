"""Experiment (issue 15, T5 family diagnosis; run from the repo root with
the .venv-test python; paths below are the 2026-11 build machine's):

    [LEVEL=small] python benchmarks/experiments/t5_tasktune.py WORKDIR STEPS LR EVAL_EVERY [INIT|scratch]

Experiment: task-tune the T5 large on every pip/stdlib code->docstring pair
(train split + pretraining files' functions, held-out inputs excluded), to see
whether more supervised data makes it use its input. Resumable; evaluates the
real-vs-shuffled-input loss gap, loss and greedy ROUGE-2/loops every EVAL steps."""
import json, os, sys, time
sys.path.insert(0, "/work/main"); sys.path.insert(0, "/work/main/scripts")
import jax, numpy as np
from specdec_jax import decoding, train as train_lib, tokenizer as tokenizer_lib
from specdec_jax.eval import default_models as dm, default_models_eval as dme
from specdec_jax.eval import corpus as corpus_lib, pretraining as pretrain_lib
from specdec_jax.models import model_from_config
import train_default_models as tdm
import default_models_plan as plan

task = "t5_docstring"
WD = sys.argv[1]; STEPS = int(sys.argv[2]); LR = float(sys.argv[3]); EVAL = int(sys.argv[4])
INIT = sys.argv[5] if len(sys.argv) > 5 else f"/work/dm_work3/{task}/large_pretrain/final_params.npz"
ONLY_STDLIB = os.environ.get("ONLY_STDLIB") == "1"
os.makedirs(WD, exist_ok=True)
out = f"/work/dm_out3/{task}"
spec = dm.TASKS[task]
tok = tokenizer_lib.Tokenizer(f"{out}/tokenizer.model", spec.family, extra_ids=0)
corpus = corpus_lib.default_corpus()
ex = corpus.examples[task]
train_rows = dme.tokenize(tok, spec, ex["train"])
if not ONLY_STDLIB:
  pre = pretrain_lib.build(corpus, pretrain_lib.site_packages_dir(), plan.PRETRAIN_BYTES[task])
  used = pretrain_lib.held_out_inputs(corpus) | frozenset(e["inputs"] for e in ex["train"])
  more = pretrain_lib.task_examples(pre, task, used)
  train_rows += dme.tokenize(tok, spec, more)
print("train rows", len(train_rows), flush=True)
val_rows = dme.tokenize(tok, spec, ex["validation"])
perm = np.random.default_rng(0).permutation(len(val_rows))
shuf = [(val_rows[perm[i]][0], val_rows[i][1]) for i in range(len(val_rows))]
LEVEL = os.environ.get("LEVEL", "large")
m = model_from_config(plan.arch(task, LEVEL, tok))
params = (train_lib.init_params(m, 5) if INIT == "scratch"
          else tdm._load_npz_params(INIT, m))
cfg = train_lib.TrainConfig(steps=STEPS, learning_rate=LR, warmup_steps=100, eval_every=EVAL, seed=31)
state = train_lib.init_state(params, cfg)
hist = []
r = train_lib.restore_state(WD, state)
if r is not None:
  state, _, _, hist = r
start = int(state.step)
print("start", start, flush=True)
step_fn = train_lib.make_train_step(m, cfg)
make = dme.batch_maker(spec, tok.eos_id, plan.PROMPT_WEIGHT)
stream = train_lib.bucketed_stream(train_rows, make, 32, lambda r: len(r[0]) + len(r[1]), seed=123, start_step=start)
vmake = dme.batch_maker(spec, tok.eos_id, 0.0)
exs = ex["validation"][:96]
t0 = time.time()
for i, batch in zip(range(start, STEPS), stream):
  state, met = step_fn(state, batch)
  if (i + 1) % 50 == 0:
    print(i + 1, "loss", float(met["loss"]), f"{time.time()-t0:.0f}s", flush=True)
  if (i + 1) % EVAL == 0 or i + 1 == STEPS:
    p32 = jax.device_get(state.params)
    p = tdm.to_bf16(p32)
    pair = dm.DefaultPair(task, m, m, p, p, tok, spec.metrics, spec.max_new_tokens, m.is_encoder_decoder, spec)
    preds, _ = dme.decode(pair, decoding.make_method("target_only"), exs, verifier="large")
    q = dme.quality(pair, exs, preds)
    q["val_loss"] = round(dme.heldout_loss(m, p32, val_rows, vmake), 4)
    q["shuffled_loss"] = round(dme.heldout_loss(m, p32, shuf, vmake), 4)
    q["step"] = i + 1; q["time"] = time.strftime("%H:%M:%S"); q["sample"] = preds[:4]
    hist.append(q)
    tdm._save_npz_params(os.path.join(WD, f"params_{i+1}.npz"), p32)
    train_lib.save_state(WD, state, i + 1, q["val_loss"], hist)
    print("EVAL", json.dumps(q), flush=True)
