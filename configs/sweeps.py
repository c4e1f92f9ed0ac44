"""Experiment sweeps (alpha grids, temperatures, top-p, gamma).

    --sweep_config=configs/sweeps.py:paper_t5

Each sweep lists methods with their knob grids and the sampling / block-size
grids; the evaluation harness runs their product over a dataset. Names:
  paper_t5     Faster Cascades T5 setting: gamma 5, temperatures 0/0.1/0.5/1
  paper_gemma  Gemma setting: gamma 1
  gamma_ablation  gamma 3, 5, 7 for SpecDecode and the token cascade
  main_job     the small grid of the built-in main job (fits 15 minutes)
  smoke        a few seconds, for tests
"""

import ml_collections

from specdec_jax.decoding import registry

# method -> {knob: values}: the paper-style grids of the method registry
# (specdec_jax/decoding/registry.py); methods without knobs map to {}.
_PAPER = {e.name: {k: list(v) for k, v in e.grid.items()}
          for e in registry.ENTRIES if e.grid is not None}
_BASELINES = {k: v for k, v in _PAPER.items() if not v}
_ALPHAS = {k: v for k, v in _PAPER.items() if v}


def _sweep(methods, temperatures, gammas, top_p=(None,), num_examples=500,
           max_new_tokens=64) -> ml_collections.ConfigDict:
  cfg = ml_collections.ConfigDict()
  cfg.methods = ml_collections.ConfigDict(
      {m: ml_collections.ConfigDict(k) for m, k in methods.items()})
  cfg.temperatures = list(temperatures)
  cfg.top_p = list(top_p)
  cfg.gammas = list(gammas)
  cfg.num_examples = num_examples
  cfg.max_new_tokens = max_new_tokens
  cfg.batch_size = 1  # the papers' latency protocol: wall clock at batch 1
  cfg.seed = 0
  return cfg


def get_config(name: str = "paper_t5") -> ml_collections.ConfigDict:
  """A named sweep (see the module docstring)."""
  if name == "paper_t5":
    return _sweep({**_BASELINES, **_ALPHAS}, [0.0, 0.1, 0.5, 1.0], [5])
  if name == "paper_gemma":
    return _sweep({**_BASELINES, **_ALPHAS}, [0.0, 1.0], [1],
                  max_new_tokens=128)
  if name == "gamma_ablation":
    return _sweep({"target_only": {}, "spec_decode": {},
                   "token_v3": {"alpha": [0.3, 0.5, 0.7]}}, [0.0, 1.0],
                  [3, 5, 7])
  if name == "main_job":
    small = {m: {k: v[1::2] if len(v) > 2 else v for k, v in g.items()}
             for m, g in _ALPHAS.items()}
    return _sweep({**_BASELINES, **small}, [0.0], [5], num_examples=40,
                  max_new_tokens=32)
  if name == "smoke":
    return _sweep({"target_only": {}, "spec_decode": {},
                   "token_v3": {"alpha": [0.3]}}, [0.0], [3], num_examples=2,
                  max_new_tokens=4)
  raise ValueError(f"unknown sweep {name!r}; choose paper_t5, paper_gemma, "
                   f"gamma_ablation, main_job or smoke")
