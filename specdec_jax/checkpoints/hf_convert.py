"""Shared machinery of the HF converters: rules and applying them.

Pure numpy: no torch import. A "state dict" here is ``{name: np.ndarray}`` with
HF's parameter names (what ``safetensors`` files hold). HF ``nn.Linear``
weights are ``[out, in]``; our kernels are ``[in, out]`` (T5, t5x layout) or
Gemma einsum layouts. Each family's converter is its own module, named in
its row of ``models/families.py`` (``converters['hf']``): ``hf_t5.py``,
``hf_gemma.py``; each offers the same names (``TIED``, ``config_from_hf``,
``hf_config``, ``rules_from_hf``, ``rules_to_hf``, ``check_files``) that
``hf.py`` calls.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from specdec_jax.models.interface import flatten_params, unflatten_params

StateDict = dict[str, np.ndarray]

# A conversion rule: (destination name, source names, fn(*sources) -> array).
# The ``*_rules_*`` functions list one rule per destination tensor, so a
# checkpoint can be converted one tensor at a time (see ``apply_rules``).
Rule = tuple[str, tuple[str, ...], Callable[..., np.ndarray]]


def _np(x) -> np.ndarray:
  return np.asarray(x)


def _get(sd: Mapping[str, Any], name: str,
         what: str = "HF checkpoint") -> np.ndarray:
  if name not in sd:
    raise ValueError(f"{what} is missing tensor '{name}'")
  return _np(sd[name])


def same(w: np.ndarray) -> np.ndarray:
  return w


def transposed(w: np.ndarray) -> np.ndarray:
  return w.T


def contiguous(w: np.ndarray) -> np.ndarray:
  return np.ascontiguousarray(w)


def contiguous_t(w: np.ndarray) -> np.ndarray:
  return np.ascontiguousarray(w.T)


def apply_rules(rules: list[Rule], source: Mapping[str, Any],
                what: str = "HF checkpoint") -> dict[str, np.ndarray]:
  """{destination: fn(*sources)} for every rule, sources read from ``source``.

  ``source`` may be any Mapping (e.g. one that reads tensors lazily); each
  rule reads only its own sources, so a generator over the rules converts a
  checkpoint one tensor at a time.
  """
  out = {}
  for dest, names, fn in rules:
    out[dest] = fn(*(_get(source, n, what) for n in names))
  return out


def params_from_state_dict(rules: list[Rule],
                           sd: Mapping[str, Any]) -> dict:
  """HF state dict -> our nested params, by a family's ``rules_from_hf``."""
  return unflatten_params(apply_rules(rules, sd))


def state_dict_from_params(rules: list[Rule], tied: Mapping[str, str],
                           params: Mapping[str, Any]) -> StateDict:
  """Our params -> HF state dict, by a family's ``rules_to_hf``, with the
  tied copies (``{copy: original}``) HF expects filled in."""
  sd = apply_rules(rules, flatten_params(params), "params")
  for alias, name in tied.items():
    sd[alias] = sd[name]
  return sd
