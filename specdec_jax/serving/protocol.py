"""The request schema of POST /v1/completions and the response bodies.

OpenAI's completions schema, plus extra fields (``extra_body`` in the
openai client, as vLLM does): ``top_k``, ``method`` (a registry name),
``alpha`` (the method's knob), ``speculation`` (``off`` | ``chain[:G]`` |
``tree[:K,D]`` | ``hierarchy[:T0,..]``) and ``request_id``. Responses carry
the generated ``token_ids`` per choice and a ``speculation`` block with the
per-level drafted / accepted counts. Every bad field is a ``BadRequest``
(HTTP 400) whose message names the field and what to send instead.
"""

from __future__ import annotations

import dataclasses
import json
import time

from specdec_jax.serving.engine import EngineRequest
from specdec_jax.serving.recipes import parse_speculation

# OpenAI fields accepted only at their neutral value.
_NEUTRAL = {"n": (1,), "best_of": (1,), "echo": (False,), "logprobs": (None, 0),
            "presence_penalty": (0, 0.0), "frequency_penalty": (0, 0.0),
            "logit_bias": (None, {}), "suffix": (None, ""), "user": None,
            "stream_options": None}
_FIELDS = {"model", "prompt", "max_tokens", "temperature", "top_p", "seed",
           "stop", "stream", "top_k", "method", "alpha", "speculation",
           "request_id", *_NEUTRAL}


class BadRequest(ValueError):
  """A request the server refuses (status 400 unless given)."""

  def __init__(self, message: str, status: int = 400, param: str | None = None):
    super().__init__(message)
    self.status, self.param = status, param


@dataclasses.dataclass(frozen=True)
class Completion:
  """A parsed completions request.

  Attributes:
    request: the engine request.
    stream: SSE streaming.
    stop: stop strings (the text ends before the first one found).
    prompt_text: whether the prompt was text (the response decodes text).
  """

  request: EngineRequest
  stream: bool
  stop: tuple[str, ...]
  prompt_text: bool


def parse_body(raw: bytes) -> dict:
  """The JSON object of a request body (BadRequest for empty, non-UTF-8 or
  non-object bodies)."""
  if not raw:
    raise BadRequest("the request body is empty; send a JSON object such as "
                     '{"prompt": "Hello", "max_tokens": 16}')
  try:
    text = raw.decode("utf-8")
  except UnicodeDecodeError as e:
    raise BadRequest(f"the request body is not UTF-8 ({e.reason} at byte "
                     f"{e.start}); encode the JSON as UTF-8") from None
  try:
    body = json.loads(text)
  except json.JSONDecodeError as e:
    raise BadRequest(f"the request body is not valid JSON ({e.msg} at line "
                     f"{e.lineno} column {e.colno})") from None
  if not isinstance(body, dict):
    raise BadRequest(f"the request body must be a JSON object, got "
                     f"{type(body).__name__}")
  return body


def _number(body, name, default, lo, hi, integer=False):
  v = body.get(name, default)
  if v is None:
    return default
  ok = (isinstance(v, int) if integer else isinstance(v, (int, float)))
  if isinstance(v, bool) or not ok or not lo <= v <= hi:
    kind = "an integer" if integer else "a number"
    raise BadRequest(f"{name} must be {kind} in [{lo}, {hi}], got {v!r}",
                     param=name)
  return v


def parse_completion(body: dict, *, model: str, tokenizer, depth: int,
                     default_speculation: str, default_gamma: int,
                     max_tokens_limit: int) -> Completion:
  """Checks a completions body and builds its engine request.

  Args:
    body: the JSON object.
    model: the served model name (``model`` must match when given).
    tokenizer: encode/decode object, or None (token-id prompts only).
    depth: levels of the served stack (hierarchy buffers).
    default_speculation: used when ``speculation`` is absent.
    default_gamma: chain length of a bare 'chain'.
    max_tokens_limit: the slot length.
  """
  unknown = sorted(set(body) - _FIELDS)
  if unknown:
    raise BadRequest(f"unknown field(s) {unknown}; the accepted fields are "
                     f"{sorted(_FIELDS)}", param=unknown[0])
  for name, ok in _NEUTRAL.items():
    if ok is not None and name in body and body[name] not in ok and not (
        body[name] is None):
      raise BadRequest(f"{name}={body[name]!r} is not supported by this "
                       f"server (only {ok[0]!r}); drop the field", param=name)
  if body.get("model") not in (None, model):
    raise BadRequest(f"model {body['model']!r} does not exist; this server "
                     f"serves {model!r} (GET /v1/models)", status=404,
                     param="model")
  if "prompt" not in body:
    raise BadRequest("prompt is required (a string or a list of token ids)",
                     param="prompt")
  prompt = body["prompt"]
  if isinstance(prompt, list) and len(prompt) == 1 and isinstance(
      prompt[0], (str, list)):
    prompt = prompt[0]  # a batch of one
  is_text = isinstance(prompt, str)
  if is_text:
    if tokenizer is None:
      raise BadRequest("this server has no tokenizer; send the prompt as a "
                       "list of token ids", param="prompt")
    if not prompt:
      raise BadRequest("prompt is an empty string; send some text",
                       param="prompt")
    try:
      ids = list(tokenizer.encode(prompt))
    except ValueError as e:
      raise BadRequest(f"prompt cannot be tokenized: {e}",
                       param="prompt") from None
  elif isinstance(prompt, list) and all(
      isinstance(t, int) and not isinstance(t, bool) for t in prompt):
    ids = prompt
  else:
    raise BadRequest("prompt must be a string or a list of integer token ids "
                     "(one prompt per request: n=1, no batches)",
                     param="prompt")
  max_tokens = _number(body, "max_tokens", min(16, max_tokens_limit), 1,
                       max_tokens_limit, True)
  temperature = _number(body, "temperature", 1.0, 0.0, 10.0)
  top_p = _number(body, "top_p", 1.0, 1e-9, 1.0)
  top_k = body.get("top_k")
  if top_k is not None and top_k != -1:
    top_k = _number(body, "top_k", None, 1, 1 << 30, True)
  else:
    top_k = None
  seed = _number(body, "seed", 0, 0, 2**32 - 1, True)
  rid = body.get("request_id")
  if rid is not None:
    rid = _number(body, "request_id", None, 0, 2**31 - 1, True)
  stream = body.get("stream", False)
  if stream is not None and not isinstance(stream, bool):
    raise BadRequest(f"stream must be true or false, got {stream!r}",
                     param="stream")
  stop = body.get("stop")
  stop = () if stop is None else (stop,) if isinstance(stop, str) else stop
  if not isinstance(stop, (list, tuple)) or len(stop) > 4 or not all(
      isinstance(s, str) and s for s in stop):
    raise BadRequest("stop must be a non-empty string or a list of up to 4 "
                     "of them", param="stop")
  if stop and tokenizer is None:
    raise BadRequest("stop strings need a tokenizer; this server has none",
                     param="stop")
  method = body.get("method", "spec_decode")
  if not isinstance(method, str):
    raise BadRequest(f"method must be a method name string, got {method!r}",
                     param="method")
  knobs = ()
  if body.get("alpha") is not None:
    knobs = (("alpha", float(_number(body, "alpha", None, -1e9, 1e9))),)
  spec_text = body.get("speculation", default_speculation)
  try:
    spec = parse_speculation(spec_text, default_gamma=default_gamma,
                             depth=depth)
  except ValueError as e:
    raise BadRequest(str(e), param="speculation") from None
  req = EngineRequest(
      prompt=tuple(ids), max_tokens=max_tokens, speculation=spec,
      method=method, knobs=knobs, temperature=float(temperature),
      top_k=top_k, top_p=None if top_p >= 1.0 else float(top_p), seed=seed,
      request_id=rid)
  return Completion(request=req, stream=bool(stream), stop=tuple(stop),
                    prompt_text=is_text)


def error_body(message: str, status: int, param: str | None = None) -> dict:
  """OpenAI-style error JSON."""
  kind = {400: "invalid_request_error", 404: "not_found_error",
          429: "rate_limit_error", 503: "service_unavailable",
          504: "timeout"}.get(status, "server_error")
  return {"error": {"message": message, "type": kind, "param": param,
                    "code": status}}


def completion_body(cid: str, model: str, text: str, token_ids, reason,
                    prompt_tokens: int, info: dict | None,
                    created: int | None = None, usage: bool = True) -> dict:
  """A ``text_completion`` object (one choice); a stream chunk when
  ``usage`` is False."""
  body = {"id": cid, "object": "text_completion",
          "created": created or int(time.time()), "model": model,
          "choices": [{"index": 0, "text": text, "logprobs": None,
                       "finish_reason": reason,
                       "token_ids": list(token_ids)}]}
  if usage:
    body["usage"] = {"prompt_tokens": prompt_tokens,
                     "completion_tokens": len(token_ids),
                     "total_tokens": prompt_tokens + len(token_ids)}
  if info:
    body["speculation"] = {k: info[k] for k in ("drafted", "accepted",
                                                 "calls") if k in info}
  return body
