"""specdec_jax's own checkpoint format: a directory with three files.

    <dir>/config.json         {"family": "t5" | "gemma", "config": {...}}
    <dir>/params.safetensors  every leaf under its '/'-joined path
    <dir>/checksums.json      SHA-256 of every leaf (``checksums.py``),
                              checked on load; optional (older checkpoints)

Small, dependency-light (safetensors + numpy), and exact: float32 and
bfloat16 leaves round-trip bit for bit. The built-in default models ship in
this format.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from safetensors.numpy import load_file, save_file

from specdec_jax.checkpoints import checksums
from specdec_jax.models import (families, flatten_params, model_from_config,
                                unflatten_params)

CONFIG = "config.json"
PARAMS = "params.safetensors"


def config_to_dict(config) -> dict[str, Any]:
  """A model config -> {"family": ..., "config": {...}} (JSON-able)."""
  fam = next((f for f in families.FAMILIES
              if isinstance(config, f.config_cls)), None)
  if fam is None:
    raise ValueError(f"unsupported config type {type(config).__name__}")
  family = fam.name
  fields = dataclasses.asdict(config)
  return {"family": family, "config": {
      k: list(v) if isinstance(v, tuple) else v for k, v in fields.items()}}


def config_from_dict(d: dict[str, Any]):
  """Inverse of :func:`config_to_dict`."""
  family = d.get("family")
  if family not in families.BY_NAME:
    raise ValueError(f"config.json names unknown model family {family!r}; "
                     f"expected {' or '.join(map(repr, families.names()))}")
  cls = families.get(family).config_cls
  known = {f.name for f in dataclasses.fields(cls)}
  cfg = dict(d.get("config", {}))
  unknown = sorted(set(cfg) - known)
  if unknown:
    raise ValueError(f"config.json has unknown {family} fields {unknown}")
  if "attention_types" in cfg:
    cfg["attention_types"] = tuple(cfg["attention_types"])
  return cls(**cfg)


def save(path: str, model, params, dtype: str | None = None) -> None:
  """Writes ``params`` of ``model`` to directory ``path``.

  Args:
    path: directory (created if needed).
    model: the T5Model / GemmaModel the parameters belong to.
    params: nested parameter dict.
    dtype: optional storage dtype ('bfloat16' halves the size).
  """
  model.check_params(params)
  os.makedirs(path, exist_ok=True)
  checksums.remove(path)
  flat = {}
  for name, leaf in flatten_params(params).items():
    arr = np.asarray(leaf)
    if dtype is not None:
      arr = arr.astype(jnp.dtype(dtype))
    flat[name] = np.ascontiguousarray(arr)
  save_file(flat, os.path.join(path, PARAMS))
  with open(os.path.join(path, CONFIG), "w") as f:
    json.dump(config_to_dict(model.config), f, indent=1)
  checksums.write_arrays(path, flat.items())


def is_native(path: str) -> bool:
  return os.path.isfile(os.path.join(path, CONFIG)) and os.path.isfile(
      os.path.join(path, PARAMS))


def load(path: str, dtype: str | None = "float32",
         verify_checksums: bool = True):
  """Reads a native checkpoint.

  Args:
    path: directory written by :func:`save`.
    dtype: dtype of the returned leaves (None keeps the stored dtype).
    verify_checksums: check every leaf against ``checksums.json`` when the
      checkpoint has one.

  Returns:
    (model, params): params as device arrays (one copy at load; numpy
    leaves would be copied to the device again by every decode call).
  """
  if not os.path.isdir(path):
    raise ValueError(f"checkpoint directory {path!r} does not exist")
  for name in (CONFIG, PARAMS):
    if not os.path.isfile(os.path.join(path, name)):
      raise ValueError(f"{path!r} is not a specdec_jax checkpoint: missing "
                       f"{name}")
  with open(os.path.join(path, CONFIG)) as f:
    try:
      meta = json.load(f)
    except json.JSONDecodeError as e:
      raise ValueError(f"{os.path.join(path, CONFIG)} is not valid JSON: {e}"
                       ) from None
  model = model_from_config(config_from_dict(meta))
  try:
    flat = load_file(os.path.join(path, PARAMS))
  except Exception as e:  # safetensors raises its own error types
    raise ValueError(f"cannot read {os.path.join(path, PARAMS)}: {e}; the "
                     f"file is truncated or corrupt") from None
  manifest = checksums.find(path) if verify_checksums else None
  if manifest is not None:
    for name in sorted(flat):
      manifest.check(name, flat[name], os.path.join(path, PARAMS))
  if dtype is not None:
    target = jnp.dtype(dtype)
    flat = {k: v.astype(target) if v.dtype != target else v
            for k, v in flat.items()}
  params = unflatten_params(flat)
  model.check_params(params)
  return model, jax.device_put(params)


__all__ = ["config_from_dict", "config_to_dict", "is_native", "load", "save"]
