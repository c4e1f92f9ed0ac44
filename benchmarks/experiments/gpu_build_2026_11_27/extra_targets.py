"""Experiment (option b of the progress log): the t5_codegen large stage
fine-tuned on the training pairs plus the 8,000 extra task pairs' real
targets (the students see those inputs with the teacher's outputs; the large
saw only 5,332 pairs and fitted them within ~250 steps).

  JAX_PLATFORMS=cpu PYTHONPATH=. python extra_targets.py WORKDIR OUT

WORKDIR must hold t5_codegen/large_pretrain/{final_params.npz,done.json}
(benchmarks/build_state/t5_codegen_large_pretrain). Same schedule, seed and
keep rule as the build's large stage; the fine-tuned model lands in
WORKDIR/t5_codegen/large/model.
"""
import os, sys, types
sys.path.insert(0, "scripts")
import train_default_models as tdm
from specdec_jax.eval import default_models_eval as dme

workdir, out = sys.argv[1:3]
args = types.SimpleNamespace(
    data="benchmarks/build_state/t5_codegen_bundle", workdir=workdir, out=out,
    force=False, smoke=False, smoke_steps=4, pretrain_bytes=0)
fam = tdm.families_from_bundle(args, ["t5_codegen"])["t5_codegen"]
extra = dme.tokenize(fam.tok, fam.spec, fam.examples["extra"])
tdm.log(f"train pairs {len(fam.train_rows)} + extra {len(extra)}")
fam.train_rows = list(fam.train_rows) + list(extra)
report = tdm.stage_train(fam, "large", args, None, tdm.Progress(workdir))
print({k: v for k, v in report.items() if k in (
    "eval_losses", "kept_step", "candidates", "check", "train_seconds")})
