"""Decode requests: strict reading and validation, before any model runs.

A request file is JSONL (``{"tokens": [2, 17, 5]}``, ``{"inputs": "text"}``,
optional ``"id"``) or plain text (one prompt per line; a line starting with
``{`` is read as JSON). :func:`read_requests` reads every line and returns the
good requests and one :class:`RequestError` per bad line, each naming the
file and line, so a decode can run the good ones and report the bad:

    not valid UTF-8                   requests.jsonl:4: not valid UTF-8 ...
    not valid JSON / not an object    requests.jsonl:2: not valid JSON ...
    "tokens": "2 17 5" / "217"        'tokens' must be a JSON list of integer
                                      ids, got the string '2 17 5' ...
    "tokens": 17.7, [2, 3.7], [true]  ... must be integers, got 3.7 ...
    ids outside [0, vocab)            ... token id 70000 at position 2 is
                                      outside the vocabulary [0, 32128)
    empty tokens / text               ... has no tokens
    text without a tokenizer          ... has text but no tokenizer ...
    both or neither of inputs/tokens  ... needs 'inputs' (text) or 'tokens'
    a repeated id                     ... id 'a' is used by line 1 already

A request longer than the verifier's maximum input length is cut to it with
a warning (:func:`fit_input`; the rule the eval harness applies to the
built-in tasks): T5 keeps the first ``limit - 1`` ids and the EOS, Gemma keeps
BOS and the last ``limit - 1`` ids.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
from typing import Sequence


@dataclasses.dataclass(frozen=True)
class Request:
  """One valid decode request.

  Attributes:
    id: the request's id (its JSON ``id``, else its 0-based position among
      the non-blank lines).
    line: 1-based line number in the input.
    ids: model input ids (T5: encoder ids; Gemma: the prompt, BOS first),
      already cut to the maximum input length.
    input_tokens: length before any cut.
    key: the output row's key, from the request's content (:func:`row_key`):
      a resumed decode matches rows by it, never by position, so deleting or
      editing a line cannot pair a request with another request's row.
  """

  id: str
  line: int
  ids: tuple[int, ...]
  input_tokens: int
  key: str = ""

  @property
  def seed_key(self) -> str:
    """What the request's randomness derives from: its JSON id if it has
    one, else its content key (never its position, which a deleted line
    shifts)."""
    return self.key if self.key.startswith("#") else self.id

  @property
  def truncated(self) -> bool:
    return self.input_tokens > len(self.ids)


@dataclasses.dataclass(frozen=True)
class RequestError:
  """A bad request line: where it is and what is wrong with it."""

  where: str
  line: int
  id: str | None
  message: str

  def __str__(self) -> str:
    rid = f" (request {self.id!r})" if self.id is not None else ""
    return f"{self.where}:{self.line}{rid}: {self.message}"


class RequestErrors(ValueError):
  """Some requests were invalid (the good ones were decoded and written).

  Attributes:
    errors: the RequestErrors, in line order.
  """

  def __init__(self, errors: Sequence[RequestError], note: str = ""):
    self.errors = list(errors)
    self.note = note
    super().__init__("\n".join([str(e) for e in self.errors] +
                               ([note] if note else [])))


@dataclasses.dataclass(frozen=True)
class Vocab:
  """What a request is checked against.

  Attributes:
    size: the verifier's vocabulary size (ids must be in [0, size)).
    encoder_decoder: T5 (ids are encoder inputs) or Gemma (ids are a prompt).
    tokenizer: a ``specdec_jax.tokenizer.Tokenizer`` or None (ids only).
    bos_id: decoder-only models: prepended to token prompts without it.
    eos_id: kept last when an encoder input is cut.
    max_input_tokens: the longest input the verifier takes (None: no limit).
  """

  size: int
  encoder_decoder: bool
  tokenizer: object = None
  bos_id: int | None = None
  eos_id: int | None = None
  max_input_tokens: int | None = None


def fit_input(ids: Sequence[int], limit: int | None, encoder_decoder: bool,
              bos_id: int | None = None, eos_id: int | None = None
              ) -> list[int]:
  """Cuts model input ids to ``limit`` (decode and eval share this rule).

  Args:
    ids: encoder ids (T5, usually ending with EOS) or a prompt (Gemma,
      usually starting with BOS).
    limit: the maximum length (None: no limit); >= 2.
    encoder_decoder: which rule applies.
    bos_id, eos_id: the special ids to keep.

  Returns:
    ``ids`` if short enough, else T5: the first ``limit - 1`` ids + the last
    id if it is EOS (else the first ``limit``); Gemma: BOS (if ``ids``
    starts with it) + the last ``limit - 1`` ids (else the last ``limit``).
    E.g. limit 4: T5 [5, 6, 7, 8, 9, 1] -> [5, 6, 7, 1]; Gemma
    [2, 5, 6, 7, 8, 9] -> [2, 7, 8, 9].
  """
  ids = list(ids)
  if limit is None or len(ids) <= limit:
    return ids
  if encoder_decoder:
    if eos_id is not None and ids[-1] == eos_id:
      return ids[:limit - 1] + [ids[-1]]
    return ids[:limit]
  if bos_id is not None and ids[0] == bos_id:
    return [ids[0]] + ids[len(ids) - (limit - 1):]
  return ids[len(ids) - limit:]


def _describe(value) -> str:
  if isinstance(value, str):
    text = value if len(value) <= 40 else value[:37] + "..."
    return f"the string {text!r}"
  return f"{type(value).__name__} {value!r}"[:80]


def parse_tokens(value, vocab_size: int | None) -> list[int]:
  """Strictly a JSON list of integer ids in [0, vocab_size).

  Raises:
    ValueError saying what was wrong and how to write it.
  """
  if isinstance(value, str):
    hint = ""
    parts = value.replace(",", " ").split()
    if parts and all(p.lstrip("-").isdigit() for p in parts):
      hint = f"; write it as a list: [{', '.join(parts)}]"
    raise ValueError(f"'tokens' must be a JSON list of integer ids, got "
                     f"{_describe(value)}{hint}")
  if not isinstance(value, list):
    raise ValueError(f"'tokens' must be a JSON list of integer ids, got "
                     f"{_describe(value)}")
  if not value:
    raise ValueError("'tokens' is empty; a request needs at least one token")
  for i, t in enumerate(value):
    if isinstance(t, bool) or not isinstance(t, int):
      raise ValueError(f"'tokens' must be integers, got {t!r} at position "
                       f"{i}")
    if t < 0 or (vocab_size is not None and t >= vocab_size):
      raise ValueError(f"token id {t} at position {i} is outside the "
                       f"vocabulary [0, {vocab_size})")
  return list(value)


def _lines(path: str | None) -> tuple[str, list[bytes]]:
  if path in (None, "-"):
    return "stdin", sys.stdin.buffer.read().split(b"\n")
  if not os.path.isfile(path):
    if os.path.isdir(path):
      raise ValueError(f"input file {path} is a directory; give a JSONL or "
                       f"text file of requests")
    raise ValueError(f"input file not found: {path}")
  with open(path, "rb") as f:
    return path, f.read().split(b"\n")


def _parse_line(raw: bytes, jsonl: bool) -> dict:
  """One line -> {'inputs'|'tokens', optional 'id'}; raises ValueError."""
  try:
    line = raw.decode("utf-8")
  except UnicodeDecodeError as e:
    raise ValueError(f"not valid UTF-8 (byte 0x{raw[e.start]:02x} at column "
                     f"{e.start + 1}); save the file as UTF-8") from None
  line = line.rstrip("\r")
  if not (jsonl or line.lstrip().startswith("{")):
    return {"inputs": line}
  try:
    obj = json.loads(line)
  except json.JSONDecodeError as e:
    raise ValueError(f"not valid JSON ({e.msg} at column {e.colno})"
                     ) from None
  if not isinstance(obj, dict):
    raise ValueError(f"expected a JSON object with 'inputs' (text) or "
                     f"'tokens' (ids), got {_describe(obj)}")
  has = [k for k in ("inputs", "tokens") if k in obj]
  if len(has) != 1:
    raise ValueError("a request needs exactly one of 'inputs' (text) or "
                     "'tokens' (a list of ids)" + (", not both" if has
                                                   else ""))
  if "id" in obj and (isinstance(obj["id"], bool) or
                      not isinstance(obj["id"], (str, int))):
    raise ValueError(f"'id' must be a string or an integer, got "
                     f"{_describe(obj['id'])}")
  return obj


def _ids(obj: dict, vocab: Vocab) -> list[int]:
  """The request's model input ids, before any cut; raises ValueError."""
  if "tokens" in obj:
    ids = parse_tokens(obj["tokens"], vocab.size)
    bos = vocab.bos_id
    if not vocab.encoder_decoder and bos is not None and ids[0] != bos:
      ids = [bos] + ids
    return ids
  text = obj["inputs"]
  if not isinstance(text, str):
    raise ValueError(f"'inputs' must be a string (text), got "
                     f"{_describe(text)}; put ids in 'tokens'")
  if vocab.tokenizer is None:
    raise ValueError("the request has text but no tokenizer is configured; "
                     "set ModelSpec.tokenizer or give 'tokens'")
  if not text.strip():
    raise ValueError("'inputs' is empty")
  tok = vocab.tokenizer
  ids = tok.encode(text, add_eos=True) if vocab.encoder_decoder else (
      tok.encode(text))
  bad = [t for t in ids if not 0 <= t < vocab.size]
  if bad:
    raise ValueError(f"the tokenizer gave id {bad[0]}, outside the "
                     f"verifier's vocabulary [0, {vocab.size})")
  return ids


def row_key(ids: Sequence[int], rid: str | None, occurrence: int = 0
            ) -> str:
  """The output row key of a request (content-addressed).

  Args:
    ids: the request's model input ids before any cut.
    rid: its JSON id, or None for a request without one.
    occurrence: for a request without an id, how many earlier requests
      without an id have the same ids (keeps repeated prompts apart).

  Returns:
    ``'<id>#<digest>'`` with an id, else ``'#<digest>.<occurrence>'``, where
    digest is the first 16 hex digits of the SHA-256 of the ids: an edited
    request gets a new key (it is decoded again), a moved one keeps its key.
  """
  digest = hashlib.sha256(json.dumps(list(ids)).encode()).hexdigest()[:16]
  return f"{rid}#{digest}" if rid is not None else f"#{digest}.{occurrence}"


def read_requests(path: str | None, vocab: Vocab
                  ) -> tuple[list[Request], list[RequestError]]:
  """Reads and validates every request of a file (or stdin for None / '-').

  Args:
    path: a .jsonl file (every line JSON), another text file (plain lines
      are text prompts; lines starting with '{' are JSON), or None / '-'.
    vocab: what ids are checked against and how text is tokenized.

  Returns:
    (good requests in file order, errors of the bad lines). Blank lines are
    skipped. Raises ValueError only when the file cannot be read at all or
    holds no request.
  """
  where, raws = _lines(path)
  jsonl = bool(path) and str(path).endswith(".jsonl")
  good, errors, seen, repeats = [], [], {}, {}
  index = 0
  for n, raw in enumerate(raws, 1):
    if not raw.strip():
      continue
    rid = str(index)
    index += 1
    try:
      obj = _parse_line(raw, jsonl)
      rid = str(obj.get("id", rid))
      if rid in seen:
        raise ValueError(f"id {rid!r} is used by line {seen[rid]} already; "
                         f"ids must be unique")
      seen[rid] = n
      ids = _ids(obj, vocab)
    except ValueError as e:
      errors.append(RequestError(where, n, rid, str(e)))
      continue
    cut = fit_input(ids, vocab.max_input_tokens, vocab.encoder_decoder,
                    vocab.bos_id, vocab.eos_id)
    if "id" in obj:
      key = row_key(ids, rid)
    else:
      occurrence = repeats.setdefault(tuple(ids), 0)
      repeats[tuple(ids)] += 1
      key = row_key(ids, None, occurrence)
    good.append(Request(rid, n, tuple(cut), len(ids), key))
  if not good and not errors:
    raise ValueError(f"no requests found in {where}")
  return good, errors


__all__ = ["Request", "RequestError", "RequestErrors", "Vocab", "fit_input",
           "parse_tokens", "read_requests", "row_key"]
