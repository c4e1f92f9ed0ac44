"""``specdec_jax serve``: load a model stack and run the HTTP server."""

from __future__ import annotations

import logging
from typing import Sequence

from specdec_jax.serving.engine import Engine
from specdec_jax.serving.metrics import Metrics
from specdec_jax.serving.scheduler import Scheduler
from specdec_jax.serving.server import create_app, serve


class TextCodec:
  """The server's tokenizer view: T5 encoder inputs end with EOS; Gemma
  prompts start with BOS (``Tokenizer.encode`` defaults)."""

  def __init__(self, tokenizer, encoder_decoder: bool):
    self.tok, self.encdec = tokenizer, encoder_decoder

  def encode(self, text: str) -> list[int]:
    return self.tok.encode(text, add_eos=self.encdec)

  def decode(self, ids) -> str:
    return self.tok.decode(ids)


def build_app(levels, tokenizer, *, model: str, slots: int = 4,
              max_prompt: int = 256, max_tokens: int = 128, steps: int = 2,
              speculation: str = "chain", gamma: int = 4,
              max_queue: int = 64, request_timeout_s: float = 120.0,
              max_pools: int = 4, drain_s: float = 5.0):
  """The app of a loaded stack [(model, params)], cheapest first."""
  engine = Engine(levels, slots=slots, max_prompt=max_prompt,
                  max_tokens=max_tokens, steps=steps, max_pools=max_pools,
                  default_gamma=gamma)
  scheduler = Scheduler(engine, Metrics(len(levels)), max_queue=max_queue)
  return create_app(scheduler, model=model, tokenizer=tokenizer,
                    request_timeout_s=request_timeout_s,
                    default_speculation=speculation, default_gamma=gamma,
                    drain_s=drain_s)


def serve_models(specs: Sequence, *, host: str, port: int, **kw) -> None:
  """Loads ``specs`` (runs.ModelSpec, cheapest first) and serves them."""
  if host not in ("127.0.0.1", "localhost", "::1"):
    logging.warning("serving on %s: the server has no authentication; "
                    "expose it only behind a proxy you control", host)
  target = specs[-1].load()  # lower levels may need it (an n-gram drafter
  loaded = [s.load(target[0]) for s in specs[:-1]] + [target]  # its vocab)
  levels = [(m, p) for m, p, _ in loaded]
  tok = loaded[-1][2]
  codec = None if tok is None else TextCodec(
      tok, levels[-1][0].is_encoder_decoder)
  name = getattr(specs[-1], "default_pair", None) or getattr(
      specs[-1], "preset", None) or "specdec_jax"
  serve(build_app(levels, codec, model=name, **kw), host=host, port=port)
