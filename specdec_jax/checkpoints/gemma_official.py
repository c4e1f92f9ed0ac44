"""Official Gemma Flax checkpoints (Orbax PyTree) <-> our Gemma parameters.

The Kaggle releases (``google/gemma/flax/2b``, ``google/gemma-2/flax/
gemma2-9b-it``, ...) are Orbax PyTree checkpoints in the FLAT layout: the
top-level keys are '/'-joined module paths mapping to the module's params
(google-deepmind/gemma ``gm/ckpts/_checkpoint.py``)::

    'transformer/embedder'                 {'input_embedding': [V, d]}
    'transformer/layer_{i}/attn/q_einsum'  {'w': [N, d, H]}
    'transformer/layer_{i}/attn/kv_einsum' {'w': [2, K, d, H]}
    'transformer/layer_{i}/attn/qkv_einsum' {'w': [3, N, d, H]}  (K == N:
                                            replaces q_einsum + kv_einsum)
    'transformer/layer_{i}/attn/attn_vec_einsum' {'w': [N, H, d]}
    'transformer/layer_{i}/mlp/gating_einsum' {'w': [2, d, F]}  ([2, F, d]
                                            if transpose_gating_einsum)
    'transformer/layer_{i}/mlp/linear'     {'w': [F, d]}
    'transformer/layer_{i}/<norm>'         {'scale': [d]}  pre_attention_norm,
                  pre_ffw_norm; Gemma 2 / 3 also post_attention_norm,
                  post_ffw_norm
    'transformer/layer_{i}/attn/_query_norm' {'scale': [H]}  (Gemma 3 QK-norm)
    'transformer/layer_{i}/attn/_key_norm'   {'scale': [H]}  (Gemma 3 QK-norm)
    'transformer/final_norm'               {'scale': [d]}

The NESTED layout (``gm.ckpts.save_params`` of a ``model.init()`` tree) is the
same nested by module, without 'transformer/' and without the 'w' level under
'mlp' (``gm/ckpts/_compat.py``); Kauldron checkpoints hold it under 'params'.
Gemma 3 checkpoints in the FLAT / NESTED layout (the ``gm.nn.Gemma3_*``
parameter tree) are read and written like Gemma 2's plus the QK-norm scales;
the STACKED layout (``transformer/stacked_layers/...``) is not supported.

Our kernels put the contracted axes first (table in ``models/gemma.py``), so
the reader transposes each leaf on the host as it is restored.
"""

from __future__ import annotations

import functools
import os
from typing import Callable

import numpy as np
from etils import epath

from specdec_jax import models
from specdec_jax.checkpoints import checksums
from specdec_jax.checkpoints import leaves as leaf_lib
from specdec_jax.models import GemmaConfig, GemmaModel

# (destination, source names, fn(*sources) -> destination array)
_Rule = tuple[str, tuple[str, ...], Callable[..., np.ndarray]]


def _t(*axes: int) -> Callable[[np.ndarray], np.ndarray]:
  return functools.partial(np.transpose, axes=axes)


def _same(w: np.ndarray) -> np.ndarray:
  return w


def _qkv_part(w: np.ndarray, part: slice | int, axes: tuple[int, ...]):
  """q ([3, N, d, H] -> [d, N, H]) or kv (-> [d, 2, N, H]) of qkv_einsum."""
  return np.transpose(w[part], axes)


def _qkv(q: np.ndarray, kv: np.ndarray) -> np.ndarray:
  """Our q [d, N, H] and kv [d, 2, N, H] -> qkv_einsum [3, N, d, H]."""
  return np.concatenate([q.transpose(1, 0, 2)[None], kv.transpose(1, 2, 0, 3)])


def _norms(cfg: GemmaConfig) -> list[str]:
  names = ["pre_attention_norm", "pre_ffw_norm"]
  if cfg.use_post_attn_norm:
    names.append("post_attention_norm")
  if cfg.use_post_ffw_norm:
    names.append("post_ffw_norm")
  return names


def _qk_norms(cfg: GemmaConfig) -> list[tuple[str, str]]:
  """(our attn/ name, official attn/ name) of the Gemma 3 QK-norms."""
  if not cfg.use_qk_norm:
    return []
  return [("query_norm", "_query_norm"), ("key_norm", "_key_norm")]


def official_shapes(cfg: GemmaConfig, use_qkv: bool) -> dict[str, tuple]:
  """{NESTED name: shape} of every leaf of an official checkpoint."""
  n, k, d, h, f = (cfg.num_heads, cfg.num_kv_heads, cfg.d_model, cfg.head_dim,
                   cfg.mlp_dim)
  out = {"embedder/input_embedding": (cfg.vocab_size, d),
         "final_norm/scale": (d,)}
  for i in range(cfg.num_layers):
    lay = f"layer_{i}"
    if use_qkv:
      out[f"{lay}/attn/qkv_einsum/w"] = (3, n, d, h)
    else:
      out[f"{lay}/attn/q_einsum/w"] = (n, d, h)
      out[f"{lay}/attn/kv_einsum/w"] = (2, k, d, h)
    out[f"{lay}/attn/attn_vec_einsum/w"] = (n, h, d)
    out[f"{lay}/mlp/gating_einsum"] = ((2, f, d) if cfg.transpose_gating_einsum
                                       else (2, d, f))
    out[f"{lay}/mlp/linear"] = (f, d)
    out.update({f"{lay}/{norm}/scale": (d,) for norm in _norms(cfg)})
    out.update({f"{lay}/attn/{theirs}/scale": (h,)
                for _, theirs in _qk_norms(cfg)})
  return out


def _import_rules(cfg: GemmaConfig, use_qkv: bool) -> list[_Rule]:
  """(our path, official NESTED names, fn) for every one of our leaves."""
  gating = _t(2, 0, 1) if cfg.transpose_gating_einsum else _t(1, 0, 2)
  rules = [("embedder/input_embedding", ("embedder/input_embedding",), _same),
           ("final_norm/scale", ("final_norm/scale",), _same)]
  for i in range(cfg.num_layers):
    lay = f"layer_{i}"
    if use_qkv:
      qkv = (f"{lay}/attn/qkv_einsum/w",)
      rules += [
          (f"{lay}/attn/q/kernel", qkv,
           functools.partial(_qkv_part, part=0, axes=(1, 0, 2))),
          (f"{lay}/attn/kv/kernel", qkv,
           functools.partial(_qkv_part, part=slice(1, 3), axes=(2, 0, 1, 3)))]
    else:
      rules += [
          (f"{lay}/attn/q/kernel", (f"{lay}/attn/q_einsum/w",), _t(1, 0, 2)),
          (f"{lay}/attn/kv/kernel", (f"{lay}/attn/kv_einsum/w",),
           _t(2, 0, 1, 3))]
    rules += [
        (f"{lay}/attn/out/kernel", (f"{lay}/attn/attn_vec_einsum/w",), _same),
        (f"{lay}/mlp/gating/kernel", (f"{lay}/mlp/gating_einsum",), gating),
        (f"{lay}/mlp/linear/kernel", (f"{lay}/mlp/linear",), _same)]
    rules += [(f"{lay}/{norm}/scale", (f"{lay}/{norm}/scale",), _same)
              for norm in _norms(cfg)]
    rules += [(f"{lay}/attn/{ours}/scale", (f"{lay}/attn/{theirs}/scale",),
               _same) for ours, theirs in _qk_norms(cfg)]
  return rules


def _export_rules(cfg: GemmaConfig) -> list[_Rule]:
  """(official NESTED name, our paths, fn) for every official leaf."""
  use_qkv = cfg.num_heads == cfg.num_kv_heads  # as the official Attention
  gating = _t(1, 2, 0) if cfg.transpose_gating_einsum else _t(1, 0, 2)
  rules = [("embedder/input_embedding", ("embedder/input_embedding",), _same),
           ("final_norm/scale", ("final_norm/scale",), _same)]
  for i in range(cfg.num_layers):
    lay = f"layer_{i}"
    q, kv = f"{lay}/attn/q/kernel", f"{lay}/attn/kv/kernel"
    if use_qkv:
      rules.append((f"{lay}/attn/qkv_einsum/w", (q, kv), _qkv))
    else:
      rules += [(f"{lay}/attn/q_einsum/w", (q,), _t(1, 0, 2)),
                (f"{lay}/attn/kv_einsum/w", (kv,), _t(1, 2, 0, 3))]
    rules += [
        (f"{lay}/attn/attn_vec_einsum/w", (f"{lay}/attn/out/kernel",), _same),
        (f"{lay}/mlp/gating_einsum", (f"{lay}/mlp/gating/kernel",), gating),
        (f"{lay}/mlp/linear", (f"{lay}/mlp/linear/kernel",), _same)]
    rules += [(f"{lay}/{norm}/scale", (f"{lay}/{norm}/scale",), _same)
              for norm in _norms(cfg)]
    rules += [(f"{lay}/attn/{theirs}/scale", (f"{lay}/attn/{ours}/scale",),
               _same) for ours, theirs in _qk_norms(cfg)]
  return rules


def _flat_keys(name: str) -> tuple[str, str]:
  """NESTED name -> (FLAT top-level key, param name)."""
  if "/mlp/" in name:
    name += "/w"
  module, param = name.rsplit("/", 1)
  return f"transformer/{module}", param


def _nested_name(keys: tuple[str, ...], layout: str) -> str:
  """Key path of a leaf in the checkpoint -> its NESTED name."""
  if layout == "nested":
    return "/".join(keys)
  module, param = keys[0][len("transformer/"):], "/".join(keys[1:])
  if "/mlp/" in module and param == "w":
    return module
  return f"{module}/{param}"


def _layout(tree, path: str) -> tuple[str, tuple[str, ...]]:
  """('flat' | 'nested', key prefix of the params) of a checkpoint tree."""
  keys = set(tree)
  if any(k.startswith("transformer/stacked_layers") for k in keys):
    raise ValueError(f"{path!r} uses the STACKED Gemma layout "
                     f"('transformer/stacked_layers/...'), which is not "
                     f"supported; save the parameters in the FLAT or NESTED "
                     f"layout (per-layer 'layer_N' modules) instead")
  if keys and all(k.startswith("transformer/") for k in keys):
    return "flat", ()
  if keys == {"collections", "opt_state", "params", "step"}:  # Kauldron
    return "nested", ("params",)
  if {"target", "state"} <= keys:
    raise ValueError(f"{path!r} is a T5X checkpoint, not a Gemma one")
  if keys == {"transformer"}:
    return "nested", ("transformer",)
  return "nested", ()


def item_manifest(item: str) -> checksums.Manifest | None:
  """The checksum manifest of an Orbax item directory (or its Kauldron step
  directory)."""
  parent = os.path.dirname(str(item).rstrip("/"))
  extra = (parent,) if os.path.basename(str(item).rstrip("/")) == (
      "default") else ()
  return checksums.find(item, *extra)


def item_dir(path: str) -> str:
  p = epath.Path(path)
  if not p.exists():
    raise ValueError(f"checkpoint path {str(path)!r} does not exist")
  if not (p / "_METADATA").exists() and (p / "default" / "_METADATA").exists():
    return str(p / "default")  # Kauldron checkpoint step directory
  return str(path)


class _Official:
  """Reads official leaves by NESTED name; the last one is kept, so q and
  kv cut from one qkv_einsum read it once."""

  def __init__(self, reader: leaf_lib.OrbaxReader, layout: str,
               prefix: tuple[str, ...]):
    self.reader, self.prefix = reader, prefix
    node = reader.metadata(prefix)
    self.names = {_nested_name(keys, layout): keys
                  for keys, _ in leaf_lib.orbax_leaves(node)}
    self._last_key, self._last = None, None

  def keys(self, name: str) -> tuple[str, ...]:
    return self.prefix + self.names[name]

  def display(self, name: str) -> str:
    return "/".join(self.keys(name))

  def read(self, name: str, dtype) -> np.ndarray:
    if self._last_key != (name, dtype):
      self._last = None  # free the previous leaf before reading the next
      self._last = self.reader.read(self.keys(name), dtype)
      self._last_key = (name, dtype)
    return self._last

  def leaf_reader(self, names: tuple[str, ...], fn):
    """``Leaf.read`` of our leaf ``fn(*official leaves)``."""
    def read(dtype, index):
      del index  # whole leaves only (Leaf.sliced is False)
      return fn(*(self.read(n, dtype) for n in names))
    return read


def _check(official: _Official, expected: dict[str, tuple], path: str,
           cfg: GemmaConfig) -> None:
  """Names and shapes of the checkpoint against ``expected``."""
  what = f"Gemma checkpoint {path!r}"
  for name, shape in expected.items():
    if name not in official.names:
      raise ValueError(f"{what} is missing '{name}' (expected shape {shape}); "
                       f"the checkpoint or preset does not match")
    got = tuple(official.reader.metadata(official.keys(name)).shape)
    if got != shape:
      hint = ""
      if name.endswith("gating_einsum") and sorted(got) == sorted(shape):
        hint = (f"; the gating einsum looks transposed: set "
                f"transpose_gating_einsum={not cfg.transpose_gating_einsum}")
      raise ValueError(f"{what} leaf '{official.display(name)}' has shape "
                       f"{got}, expected {shape}{hint}; the checkpoint or "
                       f"preset does not match")
  extra = sorted(set(official.names) - set(expected))
  if extra:
    raise ValueError(f"{what} has {len(extra)} unexpected leaf/leaves, first: "
                     f"'{official.display(extra[0])}'; the checkpoint or "
                     f"preset does not match")


def load_gemma(path: str, model, dtype="bfloat16",
               sharding: leaf_lib.ShardingArg = None,
               progress: bool | None = None,
               verify_checksums: bool = True, check_values: bool = True
               ) -> dict:
  """Restores an official Gemma 1 / 2 / 3 Flax checkpoint into our layout.

  Args:
    path: the Orbax checkpoint directory (holding ``_METADATA``); gs:// is
      passed through to Orbax.
    model: the GemmaModel (or its preset name) of the checkpoint.
    dtype: dtype of the restored leaves; None keeps the stored dtype.
    sharding: None, a Sharding, or fn(path, shape) -> Sharding (our paths
      and shapes).
    progress: progress bar (None: automatic above ~200 MB).
    verify_checksums: check every leaf read against the checkpoint's
      ``checksums.json`` (written by :func:`save_gemma`) when it has one,
      else against the sidecar recorded on its first load.
    check_values: refuse NaN/inf or |x| > 1e4 (``leaves.check_values``).

  Returns:
    Nested parameter dict of jax.Arrays in our layout, read leaf by leaf.
  """
  model = leaf_lib.resolve_model(model)
  if not isinstance(model, GemmaModel):
    raise ValueError(f"official Gemma checkpoints hold Gemma models, got "
                     f"{type(model).__name__}")
  cfg = model.config
  item = item_dir(path)
  manifest = item_manifest(item) if verify_checksums else None
  reader = leaf_lib.OrbaxReader(item, manifest)
  official = _Official(reader, *_layout(reader.tree, str(path)))
  use_qkv = "layer_0/attn/qkv_einsum/w" in official.names
  _check(official, official_shapes(cfg, use_qkv), str(path), cfg)
  expected = models.flatten_params(model.param_shapes())
  leaves = []
  for dest, names, fn in _import_rules(cfg, use_qkv):
    meta = reader.metadata(official.keys(names[0]))
    leaves.append(leaf_lib.Leaf(
        path=dest, shape=tuple(expected[dest].shape),
        dtype=np.dtype(meta.dtype), read=official.leaf_reader(names, fn),
        source=f"'{official.display(names[0])}'"))
  return leaf_lib.restore(
      leaves, model, dtype=dtype, sharding=sharding, progress=progress,
      source=str(path), check=check_values,
      sidecar=checksums.sidecar_path(str(path))
      if verify_checksums and manifest is None else None)


def save_gemma(path: str, model, params, layout: str = "flat") -> None:
  """Writes ``params`` as an official Gemma checkpoint (Orbax PyTree).

  Args:
    path: directory to create (must not exist).
    model: the GemmaModel (or preset name) of ``params``.
    params: our nested parameter dict (leaves are copied to the host).
    layout: 'flat' (as the official releases) or 'nested' (as
      ``gm.ckpts.save_params``).

  A ``checksums.json`` (SHA-256 per stored leaf, keyed by its Orbax keys
  joined with '/') is written into ``path`` and checked by :func:`load_gemma`.
  """
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  model = leaf_lib.resolve_model(model)
  if not isinstance(model, GemmaModel):
    raise ValueError(f"expected a GemmaModel, got {type(model).__name__}")
  if layout not in ("flat", "nested"):
    raise ValueError(f"layout must be 'flat' or 'nested', got {layout!r}")
  model.check_params(params)
  flat = models.flatten_params(params)
  tree: dict = {}
  for name, sources, fn in _export_rules(model.config):
    arr = np.ascontiguousarray(fn(*(np.asarray(flat[s]) for s in sources)))
    if layout == "flat":
      module, param = _flat_keys(name)
      tree.setdefault(module, {})[param] = arr
    else:
      tree[name] = arr
  if layout == "nested":
    tree = models.unflatten_params(tree)
  if epath.Path(path).exists():
    raise ValueError(f"{str(path)!r} already exists; remove it first")
  with ocp.StandardCheckpointer() as ckptr:
    ckptr.save(path, tree)
  checksums.write_arrays(path, (("/".join(keys), arr) for keys, arr
                                in checksums.flatten_keys(tree)))


__all__ = ["load_gemma", "official_shapes", "save_gemma"]
