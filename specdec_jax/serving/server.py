"""The HTTP server: FastAPI on uvicorn, OpenAI-compatible completions.

Needs the ``serve`` extra (``pip install specdec_jax[serve]``).

Why FastAPI + uvicorn: the ASGI stack vLLM and sglang serve with (the same
behaviour users expect: SSE streaming, disconnect detection, graceful
SIGTERM), typed routes in a few lines, and a real HTTP/1.1 server; the
engine runs on the scheduler thread, so the event loop only parses, queues
and streams.

    GET  /v1/models            the served model
    POST /v1/completions       text or token ids, SSE with ``stream``
    POST /v1/chat/completions  404: the built-in models have no chat format
    GET  /health               200 while the scheduler runs
    GET  /metrics              Prometheus text (metrics.py)
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import signal
import threading
import time

from fastapi import FastAPI, Request
from fastapi.responses import (JSONResponse, PlainTextResponse,
                               StreamingResponse)

from specdec_jax.serving import protocol
from specdec_jax.serving.protocol import BadRequest
from specdec_jax.serving.scheduler import (QueueFull, Scheduler,
                                           ShuttingDown, Ticket)


class _Text:
  """Incremental detokenization: the text of the ids so far, emitted as
  deltas (a trailing partial UTF-8 character waits for the next token),
  cut before the first stop string."""

  def __init__(self, tokenizer, stop):
    self.tok, self.stop = tokenizer, stop
    self.ids, self.sent, self.stopped = [], 0, False

  def add(self, ids) -> str:
    if self.tok is None:
      self.ids += ids
      return ""
    self.ids += ids
    text = self.tok.decode(self.ids)
    for s in self.stop:
      at = text.find(s)
      if at >= 0:
        text, self.stopped = text[:at], True
    if not self.stopped and text.endswith("\ufffd"):
      text = text[:-1]
    delta = text[self.sent:] if len(text) >= self.sent else ""
    self.sent = max(self.sent, len(text))
    return delta


def create_app(scheduler: Scheduler, *, model: str, tokenizer=None,
               request_timeout_s: float = 60.0,
               default_speculation: str = "chain", default_gamma: int = 4,
               drain_s: float = 5.0):
  """The FastAPI app over a (not yet started) scheduler.

  Args:
    scheduler: the scheduler (started and stopped with the app).
    model: the served model's name.
    tokenizer: object with ``encode(text)`` / ``decode(ids)``, or None.
    request_timeout_s: per-request deadline (504 after it).
    default_speculation: speculation of requests that name none.
    default_gamma: chain length of a bare 'chain'.
    drain_s: seconds in-flight requests get to finish at shutdown.
  """
  engine = scheduler.engine
  ids = itertools.count()

  @contextlib.asynccontextmanager
  async def lifespan(_):
    scheduler.start()
    try:
      yield
    finally:
      await asyncio.get_running_loop().run_in_executor(
          None, scheduler.stop, drain_s)

  app = FastAPI(title="specdec_jax", lifespan=lifespan)

  def error(status: int, message: str, param=None):
    return JSONResponse(protocol.error_body(message, status, param),
                        status_code=status)

  @app.get("/health")
  async def health():
    if not scheduler.alive:
      return error(503, "the scheduler is not running")
    waiting, running = scheduler.load()
    return {"status": "ok", "waiting": waiting, "running": running}

  @app.get("/metrics")
  async def metrics():
    return PlainTextResponse(scheduler.metrics.render(),
                             media_type="text/plain; version=0.0.4")

  @app.get("/v1/models")
  async def models():
    return {"object": "list", "data": [{
        "id": model, "object": "model", "created": 0,
        "owned_by": "specdec_jax", "max_model_len": engine.max_prompt +
        engine.max_tokens}]}

  @app.post("/v1/chat/completions")
  async def chat():
    return error(404, "chat completions are not served: the built-in models "
                 "have no chat format; use POST /v1/completions")

  @app.post("/v1/completions")
  async def completions(request: Request):
    try:
      body = protocol.parse_body(await request.body())
      comp = protocol.parse_completion(
          body, model=model, tokenizer=tokenizer, depth=len(engine.levels),
          default_speculation=default_speculation,
          default_gamma=default_gamma, max_tokens_limit=engine.max_tokens)
    except BadRequest as e:
      return error(e.status, str(e), e.param)
    loop = asyncio.get_running_loop()
    events: asyncio.Queue = asyncio.Queue()
    emit = lambda kind, payload: loop.call_soon_threadsafe(
        events.put_nowait, (kind, payload))
    ticket = Ticket(comp.request, emit, timeout_s=request_timeout_s,
                    prompt_tokens=len(comp.request.prompt))
    try:
      scheduler.submit(ticket)
    except QueueFull as e:
      return error(429, str(e))
    except ShuttingDown as e:
      return error(503, str(e))
    cid = f"cmpl-{next(ids)}"
    created = int(time.time())
    text = _Text(tokenizer, comp.stop)

    async def next_event():
      """The next event; cancels the ticket if the client went away."""
      while True:
        try:
          return await asyncio.wait_for(events.get(), 0.25)
        except asyncio.TimeoutError:
          if await request.is_disconnected():
            ticket.cancel()
            raise asyncio.CancelledError() from None

    # The first event decides the status (a request the engine refuses is a
    # 400 even when streaming).
    try:
      first = await next_event()
    except asyncio.CancelledError:
      ticket.cancel()
      raise
    if first[0] == "error":
      status, message = first[1]
      return error(status, message)

    def finish(kind, payload):
      if kind == "error":
        return None, payload
      return payload, None

    if not comp.stream:
      toks, kind, payload = [], first[0], first[1]
      try:
        while kind == "tokens":
          toks += payload
          text.add(payload)
          if text.stopped:
            ticket.cancel()
            kind, payload = "done", {"finish_reason": "stop"}
            break
          kind, payload = await next_event()
      except asyncio.CancelledError:
        ticket.cancel()
        raise
      info, err = finish(kind, payload)
      if err is not None:
        return error(err[0], err[1])
      out_text = tokenizer.decode(toks) if tokenizer is not None else ""
      if text.stopped:
        out_text = text.tok.decode(toks)
        for s in comp.stop:
          at = out_text.find(s)
          out_text = out_text[:at] if at >= 0 else out_text
      return protocol.completion_body(
          cid, model, out_text, toks, info["finish_reason"],
          ticket.prompt_tokens, info, created)

    async def sse():
      kind, payload = first
      try:
        while True:
          if kind == "tokens":
            delta = text.add(payload)
            chunk = protocol.completion_body(cid, model, delta, payload, None,
                                             0, None, created, usage=False)
            yield f"data: {json.dumps(chunk)}\n\n"
            if text.stopped:
              ticket.cancel()
              kind, payload = "done", {"finish_reason": "stop"}
              continue
          elif kind == "done":
            chunk = protocol.completion_body(
                cid, model, "", [], payload["finish_reason"], 0, payload,
                created, usage=False)
            yield f"data: {json.dumps(chunk)}\n\n"
            yield "data: [DONE]\n\n"
            return
          else:
            status, message = payload
            yield (f"data: {json.dumps(protocol.error_body(message, status))}"
                   f"\n\n")
            yield "data: [DONE]\n\n"
            return
          kind, payload = await next_event()
      finally:
        ticket.cancel()  # no-op when ended; frees the slot on disconnect

    return StreamingResponse(sse(), media_type="text/event-stream")

  return app


def serve(app, host: str = "127.0.0.1", port: int = 8000,
          graceful_s: float = 5.0) -> None:
  """Runs the app under uvicorn until SIGINT / SIGTERM (graceful: open
  streams get ``graceful_s`` seconds, then the scheduler drains), then
  returns, so the process exits with status 0."""
  import uvicorn  # pylint: disable=g-import-not-at-top

  class Server(uvicorn.Server):
    """uvicorn re-raises a caught SIGTERM after its graceful shutdown (the
    process then dies of it, status -15); a clean stop should exit 0."""

    @contextlib.contextmanager
    def capture_signals(self):
      if threading.current_thread() is not threading.main_thread():
        yield
        return
      old = {s: signal.signal(s, self.handle_exit)
             for s in (signal.SIGINT, signal.SIGTERM)}
      try:
        yield
      finally:
        for s, h in old.items():
          signal.signal(s, h)

  logging.info("serving on http://%s:%d", host, port)
  config = uvicorn.Config(app, host=host, port=port, log_level="warning",
                          timeout_graceful_shutdown=graceful_s)
  Server(config).run()
