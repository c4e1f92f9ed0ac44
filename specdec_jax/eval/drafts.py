"""Draft structures of a sweep configuration: chain, hierarchy or tree.

A :class:`harness.RunConfig` drafts in one of three ways:

    chain      (default) ``decoding.Chain(gamma)``: a block of ``gamma``
               drafted tokens
    hierarchy  ``hierarchy=(T_0, ..., T_{K-1})``: ``decoding.Stack``,
               hierarchical speculative decoding over the pair's K + 1
               levels (``pair.levels()``, cheapest first); the config's
               method verifies at the top level
    tree       ``tree='kary:2,3'``: ``decoding.Tree(...)``, a token tree
               per block, verified in ONE verifier step

gamma does not apply to a hierarchy or a tree (the buffers / the tree's
depth set the draft length), so such configs store ``gamma=0``.

:func:`structure` parses a config's fields into the structure value
(``decoding.Chain`` / ``Tree`` / ``Stack``) and :func:`decode_call` runs it
with ``decoding.decode``, as every entry point does.

Tree specs are compact text (canonical form: no spaces, default proposal
left out), ``<shape>:<sizes>[/<proposal>]``:

    'kary:2,3'          full 2-ary tree of depth 3 (2 + 4 + 8 = 14 nodes)
    'chain:5'           a chain of 5 nodes, verified as a tree
    'kary:3,2/top_k'    with a proposal kind of ``decoding.verify.tree``:
                        'without_replacement' (the default), 'iid', 'top_k'

Pairs: a hierarchy of K buffers needs exactly K + 1 levels. A pair with a
``levels()`` method (``default_models.DefaultPair``: small, medium, large;
small and large only in assets without a medium model) offers those; any
other pair offers its two models (drafter, verifier), so it runs only
one-buffer hierarchies.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from specdec_jax import decoding
from specdec_jax.decoding import registry
from specdec_jax.decoding.verify import tree as tree_lib

TREE_SHAPES = ("kary", "chain")
# Level names of a 2- and a 3-level stack (default_models.LEVELS).
LEVEL_NAMES = {2: ("small", "large"), 3: ("small", "medium", "large")}


# ---------------------------------------------------------------- trees


def _tree_parts(spec: str) -> tuple[str, tuple[int, ...], str]:
  """(shape, sizes, proposal) of a tree spec; ValueError if malformed."""
  text = "".join(str(spec).split())
  body, _, proposal = text.partition("/")
  shape, _, sizes = body.partition(":")
  want = {"kary": 2, "chain": 1}.get(shape)
  if want is None:
    raise ValueError(f"tree spec {spec!r}: unknown shape {shape!r}; write "
                     f"'kary:K,D' (a full K-ary tree of depth D) or "
                     f"'chain:N', optionally followed by '/iid' or '/top_k'")
  try:
    nums = tuple(int(x) for x in sizes.split(","))
  except ValueError:
    nums = ()
  if len(nums) != want or min(nums) < 1:
    form = ("'kary:K,D' with K, D >= 1, e.g. 'kary:2,3'" if shape == "kary"
            else "'chain:N' with N >= 1, e.g. 'chain:5'")
    raise ValueError(f"tree spec {spec!r}: write {form}")
  proposal = proposal or "without_replacement"
  if proposal not in tree_lib.PROPOSALS:
    raise ValueError(f"tree spec {spec!r}: unknown proposal {proposal!r}; "
                     f"choose one of {', '.join(tree_lib.PROPOSALS)}")
  return shape, nums, proposal


def canonical_tree(spec: str) -> str:
  """The canonical text of a tree spec ('' stays '': no tree)."""
  if not isinstance(spec, str):
    raise ValueError(f"tree must be a spec string such as 'kary:2,3', got "
                     f"{spec!r}")
  if not spec.strip():
    return ""
  shape, nums, proposal = _tree_parts(spec)
  tail = "" if proposal == "without_replacement" else f"/{proposal}"
  return f"{shape}:{','.join(map(str, nums))}{tail}"


def parse_tree(spec: str) -> decoding.Tree:
  """The ``decoding.Tree`` of a (non-empty) tree spec.

  >>> parse_tree('kary:2,3').topology.num_nodes
  14
  """
  shape, nums, proposal = _tree_parts(spec)
  topology = (decoding.Topology.kary(*nums) if shape == "kary"
              else decoding.Topology.chain(*nums))
  return decoding.Tree(topology, proposal=proposal)


def tree_label(spec: str) -> str:
  """'tree 2x3' (kary:2,3), 'tree chain 5', + ' iid' / ' top_k'."""
  shape, nums, proposal = _tree_parts(spec)
  size = "x".join(map(str, nums)) if shape == "kary" else f"chain {nums[0]}"
  tail = "" if proposal == "without_replacement" else f" {proposal}"
  return f"tree {size}{tail}"


# ---------------------------------------------------------------- hierarchy


def canonical_hierarchy(buffers) -> tuple[int, ...]:
  """Buffer sizes as a tuple of ints >= 1 (() = no hierarchy)."""
  if isinstance(buffers, (str, bytes)) or not isinstance(
      buffers, (list, tuple)):
    raise ValueError(f"hierarchy must be a tuple of buffer sizes (T_0, ..., "
                     f"T_K-1), e.g. (3, 6), got {buffers!r}")
  for t in buffers:
    if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 1:
      raise ValueError(f"hierarchy buffers must be integers >= 1, got "
                       f"{tuple(buffers)!r}")
  return tuple(int(t) for t in buffers)


def level_names(num_levels: int) -> tuple[str, ...]:
  """('small', 'medium', 'large') for 3 levels; 'L0'.. beyond."""
  return LEVEL_NAMES.get(num_levels,
                         tuple(f"L{i}" for i in range(num_levels)))


def hierarchy_label(buffers: Sequence[int]) -> str:
  """'HSD small>medium>large (3,6)'."""
  names = ">".join(level_names(len(buffers) + 1))
  return f"HSD {names} ({','.join(map(str, buffers))})"


# ---------------------------------------------------------------- configs


def supports(method: str, hierarchy: tuple[int, ...], tree: str) -> bool:
  """Whether ``method`` can run at the top of a hierarchy (a speculative
  method) or on a tree (a method with a target T(q, p); not BiLD)."""
  entry = registry.get(method)
  if hierarchy and not isinstance(entry.make(), decoding.Speculative):
    return False
  return not tree or entry.trees


def check(method: str, hierarchy: tuple[int, ...], tree: str) -> None:
  """ValueError unless ``method`` can decode with this draft structure."""
  if hierarchy and tree:
    raise ValueError(f"a config drafts with a hierarchy OR a tree, got both "
                     f"(hierarchy={hierarchy}, tree={tree!r}); make two "
                     f"configs")
  if not supports(method, hierarchy, tree):
    if hierarchy:
      raise ValueError(f"hierarchy={hierarchy} needs a speculative top-level"
                       f" method (spec_decode, lossy, a speculative cascade "
                       f"such as token_v3), got {method}")
    raise ValueError(f"tree={tree!r}: {method} does not run on draft trees "
                     f"(spec_decode, lossy and the speculative cascades do);"
                     f" drop the tree or pick another method")
  if tree:
    t = parse_tree(tree)
    if registry.get(method).greedy_only and t.proposal == "iid" and \
        t.shape[2] > 1:
      raise ValueError(f"tree={tree!r}: {method} is greedy, so i.i.d. "
                       f"siblings would all be the drafter's argmax; use "
                       f"'/top_k' or the default proposal")


def label(method: str, hierarchy: tuple[int, ...] = (), tree: str = ""
          ) -> str:
  """Readable name of a method on a draft structure (plot legends, tables).

  'SpecDecode' (chain), 'SpecDecode tree 2x3', 'HSD small>medium>large
  (3,6)' (SpecDecode at the top), 'HSD small>medium>large (3,6)
  [SpecCascade [TokenV3]]' (another top-level method).
  """
  name = registry.get(method).label if method in registry.REGISTRY else method
  if hierarchy:
    hsd = hierarchy_label(hierarchy)
    return hsd if method == "spec_decode" else f"{hsd} [{name}]"
  if tree:
    return f"{name} {tree_label(tree)}"
  return name


# ---------------------------------------------------------------- pairs


def pair_levels(pair) -> list[tuple[object, object]]:
  """[(model, params)] cheapest first: ``pair.levels()`` when the pair has
  it, else [(drafter, q_params), (verifier, p_params)]."""
  levels = getattr(pair, "levels", None)
  if callable(levels):
    return list(levels())
  return [(pair.drafter, pair.q_params), (pair.verifier, pair.p_params)]


def unsupported(pair, hierarchy: tuple[int, ...]) -> str | None:
  """Why ``pair`` cannot run this hierarchy (None when it can)."""
  if not hierarchy:
    return None
  have, need = len(pair_levels(pair)), len(hierarchy) + 1
  if have == need:
    return None
  names = ">".join(level_names(need))
  why = (" (no medium model: build the assets with one, see "
         "docs/default_models.md)" if have == 2 and need == 3 else "")
  return (f"hierarchy={hierarchy} needs {need} levels ({names}) but pair "
          f"{pair.name!r} has {have}{why}; give {have - 1} buffer size(s) "
          f"or use a pair with {need} levels")


def structure(hierarchy: tuple[int, ...], tree: str, gamma: int):
  """The draft structure value of a config's fields: ``decoding.Stack``
  (hierarchy buffers), ``decoding.Tree`` (a tree spec) or
  ``decoding.Chain`` (gamma, at least 1)."""
  if hierarchy:
    return decoding.Stack(canonical_hierarchy(hierarchy))
  if tree:
    return parse_tree(tree)
  return decoding.Chain(max(gamma, 1))


def decode_call(pair, method, hierarchy: tuple[int, ...], tree: str,
                gamma: int, sampling=None, **common) -> tuple[Callable, dict]:
  """(decode function, its keyword arguments) for one batch.

  Every structure runs through ``decoding.decode`` with the config's
  :class:`decoding.Strategy` (the harness strings parse into it).

  Args:
    pair: the model pair.
    method: the method object (``RunConfig.make_method()``).
    hierarchy, tree, gamma: the config's draft structure.
    sampling: the sampling transform.
    **common: max_new_tokens, seeds, request_ids, pad_to and prompts /
      inputs.

  Returns:
    ``(decoding.decode, kwargs)``.
  """
  strategy = decoding.Strategy(method, structure(hierarchy, tree, gamma),
                               sampling)
  levels = (pair_levels(pair) if hierarchy else
            [(pair.drafter, pair.q_params), (pair.verifier, pair.p_params)])
  return decoding.decode, dict(strategy=strategy,
                               models=[m for m, _ in levels],
                               params=[p for _, p in levels], **common)


def program_key(hierarchy: tuple[int, ...], tree: str, gamma: int) -> tuple:
  """What of the draft structure decides the compiled program: the buffers
  of a hierarchy, a tree's (N, D, C) shape and proposal (the tree itself is
  data), the chain's gamma."""
  if hierarchy:
    return ("hierarchy", hierarchy)
  if tree:
    t = parse_tree(tree)
    return ("tree", t.shape, t.proposal)
  return ("chain", max(gamma, 1))
