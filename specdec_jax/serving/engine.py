"""A slot-based serving engine over the decode programs of ``decoding``.

The JetStream engine API, for speculative strategies::

    engine = Engine(levels=[(drafter, q_params), (target, p_params)], slots=4)
    prefix = engine.prefill(request)          # encode + prefill every level
    pool = engine.pool(prefix)                # the slots of its strategy
    slot = pool.free_slot()
    engine.insert(prefix, pool, slot)         # write the row into the slot
    result = engine.generate(pool, steps=2)   # 2 iterations, ONE jitted call
    result.tokens[slot]                       # tokens emitted this call
    engine.free(pool, slot)

A pool is a fixed number of slots (static shapes: slots x slot length)
holding every level's KV cache with per-row lengths, per-row knobs, seeds,
request ids and budgets: the loop state of the request's ``LoopProgram``
(the same program ``decoding.generate`` runs), with one row per slot.
``generate`` gathers the busy slots into a power-of-two sub-batch, runs the
program's ``body`` ``steps`` times under ``lax.fori_loop`` and scatters the
rows back. A finished row is frozen by the body, and every random draw is
keyed by (seed, request id, position), so a request's tokens are those of
``decoding.generate`` of that request alone, whatever shares the pool and
whenever it was inserted.

Requests whose programs differ (chain / tree / hierarchy / target-only, the
method's rule class, greedy vs sampled) live in different pools; the engine
keeps at most ``max_pools`` of them (the least recently used idle one is
evicted). Nothing recompiles when requests come and go or their knobs
change: each pool compiles its prefill, its insert and one generate per
sub-batch size.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from specdec_jax.decoding import inputs as inputs_lib
from specdec_jax.serving import recipes
from specdec_jax.serving.recipes import Speculation


@dataclasses.dataclass(frozen=True)
class EngineRequest:
  """One completion request, as the engine sees it.

  Attributes:
    prompt: token ids (decoder-only: the prompt; encoder-decoder: the
      encoder input, the decoder starts from its start token).
    max_tokens: tokens to generate at most (<= the engine's slot length).
    speculation: how to draft (``recipes.Speculation``).
    method: registry method name (``spec_decode``, ``token_v3``, ...).
    knobs: the method's knobs as (name, value) pairs (e.g. alpha).
    temperature, top_k, top_p: sampling (temperature 0: greedy).
    seed: random seed in [0, 2**32).
    request_id: id in [0, 2**31) keying the randomness; None: derived
      from the prompt and seed as ``decoding.generate`` does.
  """

  prompt: tuple[int, ...]
  max_tokens: int = 16
  speculation: Speculation = Speculation()
  method: str = "spec_decode"
  knobs: tuple = ()
  temperature: float = 0.0
  top_k: int | None = None
  top_p: float | None = None
  seed: int = 0
  request_id: int | None = None


@dataclasses.dataclass
class Prefix:
  """A prefilled request, ready to be inserted into a slot of its pool.

  Attributes:
    key: its pool's key.
    recipe: its pool's recipe.
    batch: one-row Batch (its prompt, knobs, seed, request id, budget).
    state: one-row loop state after ``init`` (every level prefilled).
    request_id: the id keying its randomness.
  """

  key: tuple
  recipe: recipes.Recipe
  batch: object
  state: object
  request_id: int


@dataclasses.dataclass
class StepResult:
  """What one ``generate`` call emitted, per busy slot (host values).

  Attributes:
    tokens: slot -> list of token ids emitted this call.
    done: slot -> whether the slot's request finished.
    finite: slot -> False if its logits were NaN/inf.
    drafted, accepted: slot -> [levels] cumulative counters per level.
    calls: slot -> [levels] cumulative model calls per level.
  """

  tokens: dict
  done: dict
  finite: dict
  drafted: dict
  accepted: dict
  calls: dict


def _batch_axes(init, params, batch) -> object:
  """Pytree of the batch axis of each state leaf (None: shared scalar)."""
  two = jax.tree.map(lambda x: jnp.concatenate([x, x]), batch)
  s1 = jax.eval_shape(init, (params, batch))
  s2 = jax.eval_shape(init, (params, two))

  def axis(a, b):
    diff = [i for i, (x, y) in enumerate(zip(a.shape, b.shape)) if x != y]
    return diff[0] if diff else None
  return jax.tree.map(axis, s1, s2)


def _take(x, idx, ax):
  return x if ax is None else jnp.take(x, idx, axis=ax)


def _put(x, sub, idx, ax):
  if ax is None:
    return sub
  return x.at[(slice(None),) * ax + (idx,)].set(sub)


def _write_row(x, row, slot, ax):
  if ax is None:
    return x
  start = [0] * x.ndim
  start[ax] = slot
  return lax.dynamic_update_slice(x, row.astype(x.dtype), start)


class SlotPool:
  """The slots of one recipe: batch rows, loop state, host bookkeeping.

  Attributes:
    recipe: the pool's recipe (program and parameters).
    slots: number of slots.
    batch: Batch with ``slots`` rows.
    state: loop state with ``slots`` rows.
    busy: [slots] bool, slots holding a request.
    emitted: [slots] int, tokens already reported per slot.
  """

  def __init__(self, recipe, prefix: Prefix, slots: int, axes):
    self.recipe, self.slots, self.axes = recipe, slots, axes
    rep = lambda x, ax: x if ax is None else jnp.repeat(x, slots, axis=ax)
    self.batch = jax.tree.map(lambda x: rep(x, 0), prefix.batch)
    state = jax.tree.map(rep, prefix.state, axes)
    stream = state.stream.replace(done=jnp.ones((slots,), bool))
    self.state = state.replace(stream=stream)
    self.busy = np.zeros((slots,), bool)
    self.emitted = np.zeros((slots,), np.int64)

  def free_slot(self) -> int | None:
    """A free slot index, or None when every slot is busy."""
    free = np.nonzero(~self.busy)[0]
    return int(free[0]) if free.size else None

  @property
  def num_busy(self) -> int:
    return int(self.busy.sum())


class Engine:
  """Prefill / insert / generate / free over slot pools (see module doc).

  Args:
    levels: the served stack [(model, params)], cheapest first, the target
      last (two levels: a drafter/target pair; three or more also serve
      hierarchies).
    slots: slots per pool.
    max_prompt: longest prompt (token ids) a slot holds.
    max_tokens: slot length: the most tokens a request may ask for.
    steps: default iterations per ``generate`` call.
    eos_id: stop id ('auto': the target's).
    pad_id: filler id.
    max_pools: pools kept at once (one per strategy key).
    gather: run only the busy slots, gathered into a power-of-two
      sub-batch (False: every slot, one compile per pool).
  """

  def __init__(self, levels: Sequence, *, slots: int = 4,
               max_prompt: int = 64, max_tokens: int = 64, steps: int = 1,
               eos_id="auto", pad_id: int = 0, max_pools: int = 4,
               default_gamma: int = 4, gather: bool = True):
    if not levels:
      raise ValueError("levels must hold at least the target (model, params)")
    for name, v in (("slots", slots), ("max_prompt", max_prompt),
                    ("max_tokens", max_tokens), ("steps", steps),
                    ("max_pools", max_pools)):
      if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    self.levels = tuple(levels)
    self.target = self.levels[-1][0]
    self.encdec = bool(self.target.is_encoder_decoder)
    self.vocab_size = int(self.target.vocab_size)
    self.slots, self.max_tokens, self.steps = slots, max_tokens, steps
    self.max_prompt = max_prompt
    self.width = -(-max_prompt // inputs_lib.PAD_TO) * inputs_lib.PAD_TO
    self.eos_id = (getattr(self.target, "eos_id", None) if eos_id == "auto"
                   else eos_id)
    self.pad_id, self.max_pools = pad_id, max_pools
    self.default_gamma, self.gather = default_gamma, gather
    self.pools: collections.OrderedDict = collections.OrderedDict()
    self._jits: dict = {}

  # -- host-side checks ------------------------------------------------------

  def strategy(self, req: EngineRequest):
    """The sampling strategy of a request (checked)."""
    from specdec_jax import decoding  # pylint: disable=g-import-not-at-top
    t = req.temperature
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not (
        0.0 <= t <= 10.0):
      raise ValueError(f"temperature must be a number in [0, 10], got {t!r}")
    if req.top_k is not None and req.top_p is not None:
      raise ValueError("set top_k or top_p, not both")
    if req.top_k is not None:
      if isinstance(req.top_k, bool) or not isinstance(req.top_k, int) or (
          not 1 <= req.top_k <= self.vocab_size):
        raise ValueError(f"top_k must be an integer in [1, "
                         f"{self.vocab_size}], got {req.top_k!r}")
      s = decoding.TopK(req.top_k, float(t))
    elif req.top_p is not None and req.top_p < 1.0:
      if not 0.0 < req.top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {req.top_p!r}")
      s = decoding.TopP(float(req.top_p), float(t))
    else:
      s = decoding.Temperature(float(t))
    s.validate()
    return s

  def check(self, req: EngineRequest):
    """Validates a request on the host; returns (recipe, strategy, prompt
    row, prompt length, encoder row, request id).

    Raises:
      ValueError with a message naming the field and what to do.
    """
    ids = list(req.prompt)
    if not ids:
      raise ValueError("prompt is empty; send at least one token")
    if any(isinstance(t, bool) or not isinstance(t, (int, np.integer))
           for t in ids):
      raise ValueError("prompt token ids must be integers")
    bad = [t for t in ids if not 0 <= t < self.vocab_size]
    if bad:
      raise ValueError(f"prompt token id {bad[0]} is outside the vocabulary "
                       f"[0, {self.vocab_size})")
    if len(ids) > self.max_prompt:
      raise ValueError(f"prompt has {len(ids)} tokens, more than the slot's "
                       f"{self.max_prompt}; shorten it")
    mt = req.max_tokens
    if isinstance(mt, bool) or not isinstance(mt, int) or mt < 1:
      raise ValueError(f"max_tokens must be an integer >= 1, got {mt!r}")
    if mt > self.max_tokens:
      raise ValueError(f"max_tokens {mt} exceeds the slot length "
                       f"{self.max_tokens}; ask for fewer tokens")
    if isinstance(req.seed, bool) or not isinstance(req.seed, int) or not (
        0 <= req.seed < 2**32):
      raise ValueError(f"seed must be an integer in [0, 2**32), got "
                       f"{req.seed!r}")
    rid = req.request_id
    if rid is not None and (isinstance(rid, bool) or not isinstance(
        rid, int) or not 0 <= rid < 2**31):
      raise ValueError(f"request_id must be an integer in [0, 2**31), got "
                       f"{rid!r}")
    strategy = self.strategy(req)
    spec = req.speculation
    if spec.mode == "off":
      method = None
    else:
      method = recipes.make_method(req.method, dict(req.knobs))
      if method.greedy_only and not recipes.is_greedy(strategy):
        raise ValueError(f"method {req.method!r} is greedy-only; use "
                         f"temperature 0 or another method (e.g. token_v3)")
      if not getattr(method, "uses_drafter", True):
        spec = Speculation("off")
      if spec.mode == "hierarchy" and len(self.levels) < 3:
        raise ValueError("speculation 'hierarchy' needs 3+ served models")
    key_spec = (spec, req.method if method is not None else None,
                inputs_lib.sampling_static(strategy))
    recipe = self._recipe(key_spec, spec, method, strategy)
    prompt, plen, inputs = self._rows(ids)
    if rid is None:
      rid = int(inputs_lib.default_request_ids(
          prompt[None], np.asarray([plen]), None if inputs is None else
          inputs[None], np.asarray([req.seed]))[0])
    return recipe, strategy, prompt, plen, inputs, rid, method

  def _rows(self, ids):
    row = np.full((self.width,), 0, np.int64)
    row[:len(ids)] = ids
    if not self.encdec:
      return row, len(ids), None
    start = getattr(self.target.config, "decoder_start_id", 0)
    dec = np.zeros((inputs_lib.PAD_TO,), np.int64)
    dec[0] = start
    return dec, 1, row

  def _recipe(self, key_spec, spec, method, strategy):
    k = ("recipe", key_spec)
    if k not in self._jits:
      self._jits[k] = recipes.recipe_of(
          self.levels, spec, method, strategy, max_new=self.max_tokens,
          eos_id=self.eos_id, pad_id=self.pad_id,
          width=(self.width, self.encdec))
    return self._jits[k]

  # -- the engine API --------------------------------------------------------

  def prefill(self, req: EngineRequest) -> Prefix:
    """Checks a request and prefills it (encode + every level's cache)."""
    recipe, strategy, prompt, plen, inputs, rid, method = self.check(req)
    batch = recipes.row_batch(recipe, strategy, prompt, plen, inputs,
                              req.seed, rid, req.max_tokens, method=method)
    init = self._jit(recipe, "init", lambda: jax.jit(recipe.program.init))
    state = init((recipe.params, batch))
    return Prefix(key=recipe.key, recipe=recipe, batch=batch, state=state,
                  request_id=rid)

  def pool(self, prefix: Prefix) -> SlotPool:
    """The pool of a prefix's recipe (created on first use; LRU bounded).

    Raises:
      RuntimeError when ``max_pools`` pools are all busy.
    """
    key = prefix.key
    if key in self.pools:
      self.pools.move_to_end(key)
      return self.pools[key]
    if len(self.pools) >= self.max_pools:
      idle = [k for k, p in self.pools.items() if p.num_busy == 0]
      if not idle:
        raise RuntimeError(f"all {self.max_pools} strategy pools are busy; "
                           f"retry later")
      del self.pools[idle[0]]
    recipe = prefix.recipe
    axes = self._jit(recipe, "axes", lambda: _batch_axes(
        recipe.program.init, recipe.params, prefix.batch))
    self.pools[key] = SlotPool(recipe, prefix, self.slots, axes)
    return self.pools[key]

  def insert(self, prefix: Prefix, pool: SlotPool, slot: int) -> None:
    """Writes a prefilled request into ``slot`` of its pool."""
    if prefix.key != pool.recipe.key:
      raise ValueError("prefix and pool belong to different strategies")
    if not 0 <= slot < pool.slots or pool.busy[slot]:
      raise ValueError(f"slot {slot} is not a free slot of this pool")
    axes = pool.axes

    def insert(batch, state, b1, s1, slot):
      batch = jax.tree.map(lambda x, r: _write_row(x, r, slot, 0), batch, b1)
      state = jax.tree.map(lambda x, r, ax: _write_row(x, r, slot, ax),
                           state, s1, axes)
      return batch, state
    fn = self._jit(pool.recipe, "insert", lambda: jax.jit(
        insert, donate_argnums=(0, 1)))
    pool.batch, pool.state = fn(pool.batch, pool.state, prefix.batch,
                                prefix.state, jnp.int32(slot))
    pool.busy[slot] = True
    pool.emitted[slot] = 0

  def free(self, pool: SlotPool, slot: int) -> None:
    """Releases a slot (its row stays until the next insert overwrites it;
    it is never run again: generate runs busy slots only)."""
    pool.busy[slot] = False

  def _sub_batch(self, pool: SlotPool) -> np.ndarray:
    busy = np.nonzero(pool.busy)[0]
    if not self.gather:
      return np.arange(pool.slots)
    k = 1
    while k < busy.size:
      k *= 2
    k = min(k, pool.slots)
    rest = np.nonzero(~pool.busy)[0][:k - busy.size]
    return np.concatenate([busy, rest]).astype(np.int32)

  def generate(self, pool: SlotPool, steps: int | None = None) -> StepResult:
    """Runs ``steps`` iterations of the pool's program on its busy slots in
    one jitted call; returns the tokens each busy slot emitted."""
    steps = self.steps if steps is None else int(steps)
    empty = StepResult({}, {}, {}, {}, {}, {})
    if not pool.busy.any():
      return empty
    idx = self._sub_batch(pool)
    recipe, axes = pool.recipe, pool.axes
    program = recipe.program

    def gen(params, batch, state, idx):
      sub_b = jax.tree.map(lambda x: jnp.take(x, idx, axis=0), batch)
      sub = jax.tree.map(lambda x, ax: _take(x, idx, ax), state, axes)
      sub = lax.fori_loop(0, steps, lambda _, s: program.body(
          (params, sub_b), s), sub)
      out = program.finish((params, sub_b), sub)
      state = jax.tree.map(lambda x, s, ax: _put(x, s, idx, ax), state, sub,
                           axes)
      return state, (out.tokens, out.num_out, sub.stream.done, out.finite,
                     tuple((lv.drafted, lv.accepted, lv.calls)
                           for lv in out.levels))
    fn = self._jit(recipe, ("generate", idx.size, steps), lambda: jax.jit(
        gen, donate_argnums=(2,)))
    pool.state, out = fn(recipe.params, pool.batch, pool.state,
                         jnp.asarray(idx))
    tokens, num_out, done, finite, levels = jax.device_get(out)
    res = StepResult({}, {}, {}, {}, {}, {})
    for j, slot in enumerate(idx.tolist()):
      if not pool.busy[slot]:
        continue
      n = int(num_out[j])
      res.tokens[slot] = [int(t) for t in tokens[j, pool.emitted[slot]:n]]
      pool.emitted[slot] = n
      res.done[slot] = bool(done[j])
      res.finite[slot] = bool(finite[j])
      res.drafted[slot] = [int(lv[0][j]) for lv in levels]
      res.accepted[slot] = [int(lv[1][j]) for lv in levels]
      res.calls[slot] = [int(lv[2][j]) for lv in levels]
    return res

  def _jit(self, recipe, what, make):
    k = (recipe.key, what)
    if k not in self._jits:
      self._jits[k] = make()
    return self._jits[k]

  def compile_counts(self) -> dict:
    """(pool key, what) -> executables compiled (for tests)."""
    return {k: f._cache_size() for k, f in self._jits.items()  # pylint: disable=protected-access
            if hasattr(f, "_cache_size")}
