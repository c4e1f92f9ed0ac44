"""Memory plan: per-device bytes of both models' parameters and KV caches.

Computed with ``jax.eval_shape`` (nothing is allocated) and the same
logical-axis rules the sharded decode uses (``specdec_jax.sharding``), for a
mesh of ``devices`` TPU v4 chips (v4-8 = 4 chips, 32 GiB HBM each).

    python -m specdec_jax.main plan
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import models, sharding
from specdec_jax.decoding import budget
from specdec_jax.models.interface import flatten_params

GIB = 2**30
V4_HBM_GIB = 32.0
# TPU v4 slice name -> JAX devices (one per chip: a v4 TensorCore pair).
V4_TOPOLOGIES = {"v4-8": 4, "v4-16": 8, "v4-32": 16}


@dataclasses.dataclass(frozen=True)
class PlanPair:
  """A drafter/verifier pair with the lengths of its setting.

  Attributes:
    drafter, verifier: preset names.
    prompt: decoder prompt length (decoder-only) or source length (T5).
    new_tokens: generated tokens.
    gamma: draft block size (cache slack).
  """

  drafter: str
  verifier: str
  prompt: int
  new_tokens: int
  gamma: int


# The paper's settings: T5 on XSum (inputs up to 1,024 tokens) and Gemma 2
# few-shot prompts (up to ~2k tokens), gamma 5 and 1; Gemma 3 1B drafting
# for 27B (local layers keep a full-length cache here, not a ring buffer).
DEFAULT_PAIRS = (
    PlanPair("t5_1_1_small", "t5_1_1_xxl", 1024, 128, 5),
    PlanPair("gemma2_2b", "gemma2_27b", 2048, 256, 1),
    PlanPair("gemma3_1b", "gemma3_27b", 2048, 256, 4),
)


@dataclasses.dataclass(frozen=True)
class _MeshShape:
  """Stands in for a Mesh where only axis sizes matter."""

  shape: dict


def _per_device_bytes(shapes, axes_of, mesh) -> int:
  """Sum over leaves of nbytes / number of shards of that leaf."""
  total = 0
  for path, leaf in shapes.items():
    spec = sharding.logical_to_spec(axes_of(path, leaf), shape=leaf.shape,
                                    mesh=mesh)
    shards = int(np.prod([mesh.shape[a] for a in spec if a is not None]))
    total += int(np.prod(leaf.shape)) * jnp.dtype(leaf.dtype).itemsize // max(
        shards, 1)
  return total


def _param_bytes(model, mesh) -> int:
  shapes = flatten_params(model.param_shapes())
  axes = flatten_params(sharding.param_logical_axes(model.param_shapes()))
  return _per_device_bytes(shapes, lambda p, _: axes[p], mesh)


def _cache_bytes(model, batch: int, prompt: int, capacity: int, mesh) -> int:
  params = model.param_shapes()
  encoded = None
  if model.is_encoder_decoder:
    inputs = jax.ShapeDtypeStruct((batch, prompt), jnp.int32)
    encoded = jax.eval_shape(model.encode, params, inputs)
  cache = jax.eval_shape(lambda e: model.init_cache(batch, capacity, e),
                         encoded)
  leaves = {}
  for i, kv in enumerate(cache.layers):
    leaves[f"self/{i}/k"], leaves[f"self/{i}/v"] = kv.k, kv.v
  for i, kv in enumerate(cache.cross or ()):
    leaves[f"cross/{i}/k"], leaves[f"cross/{i}/v"] = kv.k, kv.v

  def axes(path, _):
    return (sharding.CROSS_KV_AXES if path.startswith("cross")
            else sharding.SELF_KV_AXES)

  return _per_device_bytes(leaves, axes, mesh)


def memory_plan(pairs: Sequence[PlanPair] = DEFAULT_PAIRS,
                topologies: Sequence[str] = tuple(V4_TOPOLOGIES),
                batches: Sequence[int] = (1, 8, 32),
                dtype: str = "bfloat16") -> list[dict]:
  """Per-device memory of each pair / topology / batch (model parallel).

  Every topology uses the mesh (data=1, fsdp=1, model=devices): heads, kv
  heads, MLP units and the vocabulary split over the chips (axes that do not
  divide are replicated). Returns one row per combination (GiB).
  """
  rows = []
  for pair in pairs:
    d = models.get_model(pair.drafter, dtype=dtype, param_dtype=dtype)
    v = models.get_model(pair.verifier, dtype=dtype, param_dtype=dtype)
    decoder_prompt = 1 if v.is_encoder_decoder else pair.prompt
    cap = budget.capacity(decoder_prompt, pair.new_tokens, pair.gamma)
    for topo in topologies:
      if topo not in V4_TOPOLOGIES:
        raise ValueError(f"unknown topology {topo!r}; choose from "
                         f"{', '.join(V4_TOPOLOGIES)}")
      n = V4_TOPOLOGIES[topo]
      mesh = _MeshShape({"data": 1, "fsdp": 1, "model": n})
      params = _param_bytes(d, mesh) + _param_bytes(v, mesh)
      for b in batches:
        caches = (_cache_bytes(d, b, pair.prompt, cap, mesh) +
                  _cache_bytes(v, b, pair.prompt, cap, mesh))
        total = (params + caches) / GIB
        rows.append(dict(
            pair=f"{pair.drafter} + {pair.verifier}", topology=topo,
            devices=n, batch=b, lengths=f"{pair.prompt}+{pair.new_tokens}",
            params_gib=params / GIB, caches_gib=caches / GIB,
            total_gib=total, fits=total <= V4_HBM_GIB))
  return rows


def format_plan(rows: Sequence[dict]) -> str:
  """Markdown table of :func:`memory_plan` rows."""
  lines = ["| pair | topology (chips) | batch | lengths | params / chip | "
           "KV caches / chip | total / chip | fits 32 GiB |",
           "|---|---|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(f"| {r['pair']} | {r['topology']} ({r['devices']}) | "
                 f"{r['batch']} | {r['lengths']} | {r['params_gib']:.2f} GiB |"
                 f" {r['caches_gib']:.2f} GiB | {r['total_gib']:.2f} GiB | "
                 f"{'yes' if r['fits'] else 'no'} |")
  return "\n".join(lines)
