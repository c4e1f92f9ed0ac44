"""Scheduler limits without compiling anything: bounded queue (429) and
timeouts (504)."""

import queue

import pytest

from specdec_jax.serving import EngineRequest
from specdec_jax.serving.metrics import Metrics
from specdec_jax.serving.scheduler import (QueueFull, Scheduler,
                                           ShuttingDown, Ticket)
from tests.serving import common


def test_queue_bound_timeout_and_shutdown():
  sched = Scheduler(common.engine(), max_queue=1)
  events = queue.Queue()
  emit = lambda kind, payload: events.put((kind, payload))
  req = EngineRequest(prompt=(2, 3), max_tokens=3)
  sched.submit(Ticket(req, emit, timeout_s=0.0))
  with pytest.raises(QueueFull, match="already waiting"):
    sched.submit(Ticket(req, emit))
  sched.start()
  kind, (status, message) = events.get(timeout=30)
  assert (kind, status) == ("error", 504) and "timed out" in message
  sched.stop(drain_s=0.0)
  assert not sched.alive
  with pytest.raises(ShuttingDown):
    sched.submit(Ticket(req, emit))
  assert 'outcome="timeout"} 1' in sched.metrics.render()


def test_metrics_text():
  m = Metrics(2)
  m.finished("ok", 3, 5, [0, 8], [0, 6], 0.3)
  m.first_token(0.02)
  m.inter_token(0.1, 2)
  text = m.render()
  assert 'specdec_spec_decode_acceptance_rate{level="1"} 0.750000' in text
  assert 'specdec_time_to_first_token_seconds_bucket{le="0.025"} 1' in text
  assert "specdec_inter_token_latency_seconds_count 2" in text
  assert "specdec_generation_tokens_total 5" in text
