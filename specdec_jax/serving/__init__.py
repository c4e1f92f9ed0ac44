"""Serving: a slot-based speculative engine and an OpenAI-style HTTP server.

    engine.py     Engine: prefill / insert / generate(steps) / free over
                  slot pools, one pool per strategy (docs/serving.md)
    recipes.py    speculation modes and the decode program of a request
    scheduler.py  the scheduler thread: queue, slots, timeouts, cancel
    server.py     FastAPI app: /v1/completions, /v1/models, /health, /metrics
    metrics.py    Prometheus counters and histograms
"""

from specdec_jax.serving.engine import Engine, EngineRequest, Prefix, SlotPool
from specdec_jax.serving.recipes import Speculation, parse_speculation

__all__ = ["Engine", "EngineRequest", "Prefix", "SlotPool", "Speculation",
           "parse_speculation"]
