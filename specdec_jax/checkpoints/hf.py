"""HF transformers checkpoints: safetensors import and export, sharded or not.

    model, params = load_hf("/ckpt/gemma-2-2b")        # config.json + weights
    save_hf("/out/t5", model, params, max_shard_bytes=2 << 30)

A checkpoint directory holds ``config.json`` and either ``model.safetensors``
or ``model-0000i-of-0000n.safetensors`` shards listed in
``model.safetensors.index.json`` (``{"weight_map": {tensor: file}}``); what
``save_pretrained`` writes and ``AutoModelFor*.from_pretrained`` reads.
Supported: the families of ``models/families.py`` with an HF converter
(``converters['hf']``, e.g. T5 v1.1 / mT5 ``T5ForConditionalGeneration``
with an untied head in ``hf_t5.py``; Gemma 1 / 2 / 3 ``Gemma*ForCausalLM`` in
``hf_gemma.py``), chosen by config.json's ``model_type`` (the table's
``hf_model_types``). Names and layouts are the converter's rules (one per
tensor); tensors are read lazily, one leaf at a time (see
``leaf_lib.restore``).

transformers 5 ties T5's ``lm_head`` to the embedding at construction unless
the checkpoint holds both tensors and they differ, so the export always writes
``lm_head.weight`` (T5 v1.1's head is untied) next to ``shared.weight``.
"""

from __future__ import annotations

import json
import os
import re
from typing import Iterator, Mapping

import jax.numpy as jnp
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from specdec_jax import models
from specdec_jax.checkpoints import checksums
from specdec_jax.checkpoints import leaves as leaf_lib
from specdec_jax.models import families

CONFIG = "config.json"
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
_SHARD = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")
_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16",
           "BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn",
           "F8_E5M2": "float8_e5m2", "I64": "int64", "I32": "int32",
           "I16": "int16", "I8": "int8", "U64": "uint64", "U32": "uint32",
           "U16": "uint16", "U8": "uint8", "BOOL": "bool"}


class SafetensorsFiles(Mapping):
  """Lazy ``{name: np.ndarray}`` over one or more safetensors files.

  Only the headers are read on construction; ``files[name]`` reads (memory
  maps) one tensor and, with a ``manifest``, checks its checksum.
  """

  def __init__(self, files: list[str],
               manifest: checksums.Manifest | None = None):
    self.manifest = manifest
    self._where: dict[str, str] = {}
    self._handles = {}
    for file in files:
      if not os.path.isfile(file):
        raise ValueError(f"safetensors file {file!r} does not exist")
      try:
        handle = safe_open(file, framework="numpy")
      except Exception as e:  # safetensors raises SafetensorError
        raise ValueError(f"cannot read {file!r}: {e}; the file is truncated "
                         f"or corrupt") from None
      for name in handle.keys():
        if name in self._where:
          raise ValueError(f"tensor {name!r} is stored twice, in "
                           f"{self._where[name]!r} and {file!r}")
        self._where[name] = file
      self._handles[file] = handle

  def __getitem__(self, name: str) -> np.ndarray:
    # A fresh handle per tensor: the file is memory-mapped, and a handle kept
    # open keeps every page it has read resident (RSS grows by the file size).
    with safe_open(self._where[name], framework="numpy") as handle:
      arr = handle.get_tensor(name)
    if self.manifest is not None:
      self.manifest.check(name, arr, repr(self._where[name]))
    return arr

  def __iter__(self) -> Iterator[str]:
    return iter(self._where)

  def __len__(self) -> int:
    return len(self._where)

  def names(self) -> list[str]:
    return sorted(self._where)

  def file(self, name: str) -> str:
    return self._where[name]

  def shape(self, name: str) -> tuple[int, ...]:
    return tuple(self._handles[self._where[name]].get_slice(name).get_shape())

  def dtype(self, name: str) -> np.dtype:
    code = self._handles[self._where[name]].get_slice(name).get_dtype()
    if code not in _DTYPES:
      raise ValueError(f"tensor {name!r} in {self.file(name)!r} has "
                       f"unsupported safetensors dtype {code}")
    return np.dtype(jnp.dtype(_DTYPES[code]))

  def leaf(self, path: str, name: str) -> leaf_lib.Leaf:
    """A :class:`leaf_lib.Leaf` of our ``path`` stored unchanged as ``name``."""
    return leaf_lib.Leaf(path=path, shape=self.shape(name),
                       dtype=self.dtype(name),
                       read=lambda dt, index: self[name],
                       source=f"tensor '{name}' in {self.file(name)!r}")


def weight_files(path: str) -> list[str]:
  """The safetensors files of an HF checkpoint directory."""
  index = os.path.join(path, INDEX)
  if os.path.isfile(index):
    try:
      with open(index) as f:
        weight_map = json.load(f)["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
      raise ValueError(f"{index} is not a valid safetensors index (needs a "
                       f"'weight_map'): {e}") from None
    if not isinstance(weight_map, dict):
      raise ValueError(f"{index}: 'weight_map' must map tensor names to "
                       f"file names, got {type(weight_map).__name__}")
    root = os.path.realpath(path)
    files = []
    for f in sorted(set(weight_map.values())):
      full = os.path.realpath(os.path.join(path, str(f)))
      if (not isinstance(f, str) or os.path.isabs(f) or
          os.path.dirname(full) != root):
        raise ValueError(f"{index} names the weight file {f!r}, which is not "
                         f"a file of the checkpoint directory {path!r}; an "
                         f"index may only name files next to it (fix or "
                         f"re-download the index)")
      files.append(os.path.join(path, f))
    return files
  if os.path.isfile(os.path.join(path, SINGLE)):
    return [os.path.join(path, SINGLE)]
  found = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
  if not found:
    raise ValueError(f"{path!r} holds no *.safetensors weights")
  return [os.path.join(path, f) for f in found]


def read_config(path: str) -> dict:
  """The HF ``config.json`` of ``path`` as a dict."""
  file = os.path.join(path, CONFIG)
  if not os.path.isfile(file):
    raise ValueError(f"{path!r} is not an HF checkpoint: missing {CONFIG}")
  with open(file) as f:
    try:
      return json.load(f)
    except json.JSONDecodeError as e:
      raise ValueError(f"{file} is not valid JSON: {e}") from None


def model_from_hf_config(config: Mapping, path: str = "config"):
  """(model, rules from HF, tied aliases) for an HF config dict."""
  model_type = config.get("model_type")
  fam = families.of_hf_type(model_type)
  if fam is None:
    supported = [t for f in families.FAMILIES
                 for t in f.hf_model_types + f.hf_later_types]
    raise ValueError(f"{path}: unsupported HF model_type {model_type!r}; "
                     f"supported: {', '.join(supported)}")
  conv = fam.converter("hf")
  try:
    cfg = conv.config_from_hf(config)
  except KeyError as e:
    raise ValueError(f"{path}: config.json lacks {e}") from None
  return fam.model_cls(cfg), conv.rules_from_hf(cfg), conv.TIED


def load_hf(path: str, dtype="bfloat16", sharding: leaf_lib.ShardingArg = None,
            progress: bool | None = None, verify_checksums: bool = True,
            check_values: bool = True):
  """Loads an HF safetensors checkpoint (single file or sharded).

  Args:
    path: directory with config.json and the safetensors file(s).
    dtype: dtype of the restored leaves; None keeps the stored dtype.
    sharding: None, a Sharding, or fn(path, shape) -> Sharding.
    progress: progress bar (None: automatic above ~200 MB).
    verify_checksums: check every tensor read against the checkpoint's
      ``checksums.json`` when it has one (``checksums.py``), else against
      the sidecar recorded on its first load (``checksums.sidecar_path``).
    check_values: refuse NaN/inf or |x| > 1e4 (``leaves.check_values``).

  Returns:
    (model, params): a T5Model or GemmaModel from config.json and its params.
  """
  path = str(path)
  model, rules, tied = model_from_hf_config(read_config(path), path)
  manifest = checksums.find(path) if verify_checksums else None
  files = SafetensorsFiles(weight_files(path), manifest)
  families.of_model(model).converter("hf").check_files(files, path)
  used = set(tied)
  for dest, names, _ in rules:
    for name in names:
      if name not in files:
        raise ValueError(f"HF checkpoint {path!r} is missing tensor '{name}' "
                         f"(needed for '{dest}')")
    used.update(names)
  extra = [n for n in files.names() if n not in used]
  if extra:
    raise ValueError(f"HF checkpoint {path!r} has {len(extra)} unexpected "
                     f"tensor(s), first: '{extra[0]}'; it is not a "
                     f"{type(model).__name__} with this config")
  expected = models.flatten_params(model.param_shapes())
  leaves = [_rule_leaf(files, dest, names, fn, tuple(expected[dest].shape))
            for dest, names, fn in rules]
  return model, leaf_lib.restore(
      leaves, model, dtype=dtype, sharding=sharding, progress=progress,
      source=path, check=check_values, sidecar=checksums.sidecar_path(path)
      if verify_checksums and manifest is None else None)


def _rule_leaf(files: SafetensorsFiles, dest: str, names: tuple[str, ...], fn,
               shape: tuple[int, ...]) -> leaf_lib.Leaf:
  """A leaf converted by one HF converter rule from its HF tensors."""
  shapes = ", ".join(f"'{n}' {files.shape(n)}" for n in names)
  return leaf_lib.Leaf(
      path=dest, shape=shape, dtype=files.dtype(names[0]),
      read=lambda dt, index: fn(*(files[n] for n in names)),
      source=f"HF tensor(s) {shapes}")


def hf_config(model) -> dict:
  """The config.json dict of ``model`` for transformers."""
  return families.of_model(model).converter("hf").hf_config(model.config)


def _remove_old_weights(path: str) -> None:
  for name in os.listdir(path):
    if name in (SINGLE, INDEX) or _SHARD.fullmatch(name):
      os.remove(os.path.join(path, name))


def save_hf(path: str, model, params, max_shard_bytes: int | None = None
            ) -> None:
  """Writes an HF checkpoint that ``AutoModelFor*.from_pretrained`` loads.

  Tensors keep the parameters' dtype (config.json's ``dtype`` says which).
  Previous weight files of ``path`` are removed first. A ``checksums.json``
  (SHA-256 per tensor; transformers ignores it) is written last and checked
  by :func:`load_hf`.

  Args:
    path: output directory (created if needed).
    model: the T5Model / GemmaModel of ``params``.
    params: nested parameter dict.
    max_shard_bytes: split into ``model-0000i-of-0000n.safetensors`` shards
      of at most this size (a tensor larger than that gets its own shard)
      plus ``model.safetensors.index.json``; None writes one file.
  """
  model.check_params(params)
  if max_shard_bytes is not None and max_shard_bytes < 1:
    raise ValueError(f"max_shard_bytes must be >= 1, got {max_shard_bytes}")
  config = hf_config(model)
  flat = models.flatten_params(params)
  dtypes = {np.dtype(jnp.dtype(getattr(x, "dtype", np.float32))).name
            for x in flat.values()}
  config["dtype"] = "bfloat16" if dtypes == {"bfloat16"} else "float32"
  rules = families.of_model(model).converter("hf").rules_to_hf(model.config)
  os.makedirs(path, exist_ok=True)
  _remove_old_weights(path)
  checksums.remove(path)
  written, sums = [], {}
  current, size = {}, 0
  for name, sources, fn in rules:
    arr = np.ascontiguousarray(fn(*(np.asarray(flat[s]) for s in sources)))
    if (max_shard_bytes is not None and current
        and size + arr.nbytes > max_shard_bytes):
      written.append(_write_shard(path, len(written), current))
      current, size = {}, 0
    current[name] = arr
    sums[name] = checksums.entry(arr)
    size += arr.nbytes
  written.append(_write_shard(path, len(written), current))
  n = len(written)
  if n == 1:
    os.replace(written[0][0], os.path.join(path, SINGLE))
  else:
    weight_map = {}
    for i, (tmp, names, _) in enumerate(written):
      final = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
      os.replace(tmp, os.path.join(path, final))
      weight_map.update({name: final for name in names})
    with open(os.path.join(path, INDEX), "w") as f:
      json.dump({"metadata": {"total_size": sum(b for _, _, b in written)},
                 "weight_map": dict(sorted(weight_map.items()))}, f, indent=1)
  with open(os.path.join(path, CONFIG), "w") as f:
    json.dump(config, f, indent=1)
  checksums.write(path, sums)


def _write_shard(path: str, i: int, tensors: dict[str, np.ndarray]):
  """Writes one shard under a temporary name -> (file, names, bytes)."""
  tmp = os.path.join(path, f"model-{i + 1:05d}.safetensors.tmp")
  save_file(tensors, tmp, metadata={"format": "pt"})
  return tmp, list(tensors), sum(a.nbytes for a in tensors.values())


__all__ = ["SafetensorsFiles", "hf_config", "load_hf", "model_from_hf_config",
           "read_config", "save_hf"]
