"""The scheduler thread: admits requests into slots and steps the engine.

Requests arrive as :class:`Ticket` objects through ``submit`` (a bounded
queue: ``QueueFull`` when full, which the server answers with 429). One
thread owns the engine (JAX calls are not interleaved): each round it
prefills waiting requests into free slots of their strategy's pool (FIFO
per pool; a request whose pool is full waits without blocking the others),
runs one ``generate`` per pool with busy slots and hands every emitted token
to its ticket's callback. Cancelled tickets (client gone) and timed-out
ones free their slot at the next round. ``stop`` refuses new work, lets
in-flight requests finish for up to ``drain_s`` seconds, then cancels the
rest and joins the thread.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import threading
import time
from typing import Callable

from specdec_jax.serving.engine import Engine, EngineRequest
from specdec_jax.serving.metrics import Metrics


class QueueFull(Exception):
  """The request queue is full (HTTP 429)."""


class ShuttingDown(Exception):
  """The server is stopping and takes no new requests (HTTP 503)."""


@dataclasses.dataclass(eq=False)
class Ticket:
  """One request in flight.

  Attributes:
    request: the engine request.
    emit: callback(kind, payload) called from the scheduler thread with
      ('tokens', [ids]), ('done', info dict) or ('error', (status, message)).
      Exactly one 'done' or 'error' ends a ticket.
    timeout_s: seconds from submission until the request is cut (504).
    prompt_tokens: prompt length (for metrics).
  """

  request: EngineRequest
  emit: Callable[[str, object], None]
  timeout_s: float = 60.0
  prompt_tokens: int = 0
  id: int = 0
  submitted: float = 0.0
  first_token: float | None = None
  last_token: float | None = None
  generated: int = 0
  cancelled: bool = False
  ended: bool = False

  def cancel(self) -> None:
    """Asks the scheduler to drop this request and free its slot (any
    thread)."""
    self.cancelled = True


class Scheduler:
  """Runs an Engine on its own thread (see module docstring).

  Args:
    engine: the slot engine.
    metrics: where to count.
    max_queue: waiting requests at most (beyond: QueueFull).
    idle_wait_s: how long the thread sleeps when there is nothing to do.
  """

  def __init__(self, engine: Engine, metrics: Metrics | None = None,
               max_queue: int = 64, idle_wait_s: float = 0.02):
    self.engine = engine
    self.metrics = metrics or Metrics(len(engine.levels))
    self.max_queue, self.idle_wait_s = max_queue, idle_wait_s
    self._incoming: collections.deque = collections.deque()
    self._waiting: collections.deque = collections.deque()
    self._live: dict = {}  # (pool key, slot) -> Ticket
    self._cv = threading.Condition()
    self._ids = itertools.count()
    self._accepting = True
    self._stop = False
    self._thread = threading.Thread(target=self._run, name="specdec-sched",
                                    daemon=True)
    self.rounds = 0
    self.error: BaseException | None = None

  def start(self) -> "Scheduler":
    self._thread.start()
    return self

  @property
  def alive(self) -> bool:
    return self._thread.is_alive()

  def load(self) -> tuple[int, int]:
    """(requests waiting, requests in slots)."""
    return len(self._incoming) + len(self._waiting), len(self._live)

  def submit(self, ticket: Ticket) -> Ticket:
    """Queues a ticket; raises QueueFull / ShuttingDown."""
    with self._cv:
      if not self._accepting:
        raise ShuttingDown("the server is shutting down")
      if sum(self.load()) - len(self._live) >= self.max_queue:
        raise QueueFull(f"{self.max_queue} requests are already waiting; "
                        f"retry later")
      ticket.id = next(self._ids)
      ticket.submitted = time.monotonic()
      self._incoming.append(ticket)
      self._cv.notify()
    return ticket

  def stop(self, drain_s: float = 5.0) -> None:
    """Refuses new requests, drains for ``drain_s`` seconds, cancels the
    rest and joins the thread."""
    with self._cv:
      self._accepting = False
    end = time.monotonic() + drain_s
    while sum(self.load()) and time.monotonic() < end and self.alive:
      time.sleep(0.02)
    with self._cv:
      self._stop = True
      self._cv.notify()
    self._thread.join(timeout=max(5.0, drain_s))

  # -- the thread ------------------------------------------------------------

  def _end(self, t: Ticket, kind: str, payload, outcome: str,
           stats=None) -> None:
    if t.ended:
      return
    t.ended = True
    drafted, accepted = stats if stats else (None, None)
    self.metrics.finished(outcome, t.prompt_tokens, t.generated, drafted,
                          accepted, time.monotonic() - t.submitted)
    try:
      t.emit(kind, payload)
    except Exception:  # pylint: disable=broad-except
      logging.exception("ticket callback failed")

  def _expired(self, t: Ticket, now: float) -> bool:
    return now - t.submitted > t.timeout_s

  def _admit(self) -> bool:
    """Prefills waiting tickets into free slots; True if any was."""
    with self._cv:
      while self._incoming:
        self._waiting.append(self._incoming.popleft())
    did, keep, now = False, collections.deque(), time.monotonic()
    full = set()  # pools with no free slot this round
    while self._waiting:
      t = self._waiting.popleft()
      if t.cancelled:
        self._end(t, "error", (499, "cancelled"), "cancelled")
        continue
      if self._expired(t, now):
        self._end(t, "error", (504, f"timed out after {t.timeout_s:g} s "
                                    f"waiting for a slot"), "timeout")
        continue
      try:
        recipe = self.engine.check(t.request)[0]
        if recipe.key in full:
          keep.append(t)
          continue
        pool = self.engine.pools.get(recipe.key)
        if pool is not None and pool.free_slot() is None:
          full.add(recipe.key)
          keep.append(t)
          continue
        prefix = self.engine.prefill(t.request)
        pool = self.engine.pool(prefix)
        slot = pool.free_slot()
        self.engine.insert(prefix, pool, slot)
      except ValueError as e:
        self._end(t, "error", (400, str(e)), "error")
        continue
      except RuntimeError:  # every pool busy: wait for one to drain
        keep.append(t)
        continue
      self._live[(prefix.key, slot)] = t
      did = True
    self._waiting = keep
    return did

  def _step(self) -> bool:
    """One generate per pool with busy slots; True if any ran."""
    ran = False
    for key, pool in list(self.engine.pools.items()):
      for slot in range(pool.slots):  # drop cancelled / expired first
        t = self._live.get((key, slot))
        if t is None:
          continue
        now = time.monotonic()
        if t.cancelled or self._expired(t, now):
          self.engine.free(pool, slot)
          del self._live[(key, slot)]
          if t.cancelled:
            self._end(t, "error", (499, "cancelled"), "cancelled")
          else:
            self._end(t, "error", (504, f"timed out after {t.timeout_s:g} "
                                        f"s"), "timeout")
      if not pool.busy.any():
        continue
      res = self.engine.generate(pool)
      ran, now = True, time.monotonic()
      for slot, toks in res.tokens.items():
        t = self._live.get((key, slot))
        if t is None:
          continue
        if toks:
          if t.first_token is None:
            t.first_token = now
            self.metrics.first_token(now - t.submitted)
            if len(toks) > 1:
              self.metrics.inter_token(0.0, len(toks) - 1)
          else:
            self.metrics.inter_token(now - t.last_token, len(toks))
          t.last_token = now
          t.generated += len(toks)
          t.emit("tokens", toks)
        if res.done[slot]:
          self.engine.free(pool, slot)
          del self._live[(key, slot)]
          if not res.finite[slot]:
            self._end(t, "error", (500, "the model produced NaN/inf logits"),
                      "error")
            continue
          reason = ("length" if t.generated >= t.request.max_tokens
                    else "stop")
          info = dict(finish_reason=reason, drafted=res.drafted[slot],
                      accepted=res.accepted[slot], calls=res.calls[slot])
          self._end(t, "done", info, "ok",
                    (res.drafted[slot], res.accepted[slot]))
    return ran

  def _run(self) -> None:
    try:
      while True:
        with self._cv:
          if self._stop:
            break
        did = self._admit()
        did = self._step() or did
        self.rounds += 1
        self.metrics.set_load(*self.load())
        if not did:
          with self._cv:
            if not self._incoming and not self._stop:
              self._cv.wait(self.idle_wait_s)
    except BaseException as e:  # pylint: disable=broad-except
      logging.exception("scheduler thread crashed")
      self.error = e
    finally:
      for t in list(self._waiting) + list(self._incoming) + list(
          self._live.values()):
        self._end(t, "error", (503, "the server is shutting down"),
                  "cancelled")
      self._live.clear()
