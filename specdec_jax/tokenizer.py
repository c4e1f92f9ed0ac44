"""SentencePiece tokenizers with the special-id layouts of the families.

The layouts are columns of ``models/families.py`` (``special_ids``,
``extra_ids``, ``add_bos``, ``special_pieces``):

    T5:    pad 0, eos 1, unk 2, no bos; ``extra_ids`` sentinels appended at
           the top of the vocabulary (<extra_id_0> = vocab_size - 1), so the
           public 32000-piece model gives 32100 ids.
    Gemma: pad 0, eos 1, bos 2, unk 3; prompts start with bos.

Drafter and verifier must share one vocabulary; :func:`check_same_vocabulary`
says clearly when they do not.
"""

from __future__ import annotations

import hashlib
import io
import os
from typing import Iterable, Sequence

import sentencepiece as spm

from specdec_jax.models import families

LAYOUTS = {f.name: dict(f.special_ids) for f in families.FAMILIES}


def _check_family(family: str) -> None:
  if family not in LAYOUTS:
    raise ValueError(f"family must be "
                     f"{' or '.join(map(repr, LAYOUTS))}, got {family!r}")


class Tokenizer:
  """A SentencePiece model plus the special-id conventions of a family.

  Args:
    model: path to a ``.model`` file or its serialized bytes, or a GGUF
      file (path or bytes; its SentencePiece vocabulary is rebuilt from
      ``tokenizer.ggml.*``, see ``checkpoints/gguf.py``).
    family: a family of models/families.py ('t5', 'gemma'): which special
      ids to expect.
    extra_ids: T5 sentinel ids appended after the pieces (100 for the
      public T5 vocabulary; 0 for Gemma).
  """

  def __init__(self, model: str | bytes, family: str = "t5",
               extra_ids: int | None = None):
    _check_family(family)
    if isinstance(model, (str, os.PathLike)):
      if not os.path.isfile(model):
        raise ValueError(f"SentencePiece model {model!r} does not exist")
      if str(model).endswith(".gguf"):
        model = _gguf_proto(str(model))
      else:
        with open(model, "rb") as f:
          model = f.read()
    if bytes(model[:4]) == b"GGUF":
      model = _gguf_proto(bytes(model))
    self._proto = bytes(model)
    self._sp = spm.SentencePieceProcessor()
    try:
      self._sp.LoadFromSerializedProto(self._proto)
    except Exception as e:  # sentencepiece raises RuntimeError / OSError
      raise ValueError(f"not a valid SentencePiece model: {e}") from None
    self.family = family
    self.extra_ids = (families.get(family).extra_ids if extra_ids is None
                      else extra_ids)
    want = LAYOUTS[family]
    got = dict(pad_id=self._sp.pad_id(), eos_id=self._sp.eos_id(),
               unk_id=self._sp.unk_id(), bos_id=self._sp.bos_id())
    bad = {k: (v, want[k]) for k, v in got.items() if v != want[k]}
    if bad:
      detail = ", ".join(f"{k}={v[0]} (expected {v[1]})" for k, v in
                         bad.items())
      raise ValueError(f"SentencePiece model does not follow the {family} "
                       f"special-id layout: {detail}")

  @property
  def pad_id(self) -> int:
    return self._sp.pad_id()

  @property
  def eos_id(self) -> int:
    return self._sp.eos_id()

  @property
  def bos_id(self) -> int | None:
    b = self._sp.bos_id()
    return None if b < 0 else b

  @property
  def unk_id(self) -> int:
    return self._sp.unk_id()

  @property
  def vocab_size(self) -> int:
    """Pieces plus extra ids (T5 sentinels)."""
    return self._sp.get_piece_size() + self.extra_ids

  @property
  def fingerprint(self) -> str:
    """SHA-256 of the serialized model + extra ids: equal iff same vocab."""
    h = hashlib.sha256(self._proto)
    h.update(str(self.extra_ids).encode())
    return h.hexdigest()

  def extra_id(self, i: int) -> int:
    """Id of <extra_id_i> (T5 sentinels count down from the top)."""
    if not 0 <= i < self.extra_ids:
      raise ValueError(f"extra id {i} out of range [0, {self.extra_ids})")
    return self.vocab_size - 1 - i

  def encode(self, text: str, add_bos: bool | None = None,
             add_eos: bool = False) -> list[int]:
    """Text -> ids. ``add_bos`` defaults to True for Gemma, False for T5."""
    ids = list(self._sp.EncodeAsIds(text))
    if add_bos is None:
      add_bos = families.get(self.family).add_bos
    if add_bos:
      if self.bos_id is None:
        raise ValueError("this tokenizer has no BOS id")
      ids = [self.bos_id] + ids
    if add_eos:
      ids.append(self.eos_id)
    return ids

  def decode(self, ids: Iterable[int]) -> str:
    """Ids -> text; stops at EOS, drops pad/bos, renders T5 extra ids."""
    parts, run, pieces = [], [], self._sp.get_piece_size()
    for i in map(int, ids):
      if i == self.eos_id:
        break
      if i == self.pad_id or i == self.bos_id:
        continue
      if i >= pieces:  # a sentinel: flush the text run, then the marker
        parts.append(self._sp.DecodeIds(run))
        parts.append(f"<extra_id_{self.vocab_size - 1 - i}>")
        run = []
      else:
        run.append(i)
    parts.append(self._sp.DecodeIds(run))
    return "".join(parts)

  def encode_batch(self, texts: Sequence[str], **kw) -> list[list[int]]:
    return [self.encode(t, **kw) for t in texts]

  def decode_batch(self, rows: Sequence[Sequence[int]]) -> list[str]:
    return [self.decode(r) for r in rows]

  def save(self, path: str) -> None:
    """Writes the SentencePiece model (``.model``) to ``path``."""
    with open(path, "wb") as f:
      f.write(self._proto)


def _gguf_proto(model: str | bytes) -> bytes:
  """Serialized SentencePiece model of a GGUF file (path or its bytes)."""
  # pylint: disable=g-import-not-at-top  (gguf is an optional dependency)
  import tempfile
  from specdec_jax.checkpoints import gguf
  if isinstance(model, str):
    return gguf.tokenizer_proto(gguf.open_gguf(model))
  with tempfile.NamedTemporaryFile(suffix=".gguf") as f:
    f.write(model)
    f.flush()
    return gguf.tokenizer_proto(gguf.open_gguf(f.name))


def from_gguf(path: str) -> Tokenizer:
  """The tokenizer stored in a GGUF file (``checkpoints/gguf.py``), with
  the layout of the family that reads GGUF (``models/families.py``)."""
  family = next(f.name for f in families.FAMILIES if "gguf" in f.converters)
  return Tokenizer(str(path), family)


def check_same_vocabulary(drafter: Tokenizer, verifier: Tokenizer) -> None:
  """Raises ValueError unless both tokenizers map text to the same ids."""
  if drafter.fingerprint != verifier.fingerprint:
    raise ValueError(
        f"drafter and verifier tokenizers differ (vocab sizes "
        f"{drafter.vocab_size} vs {verifier.vocab_size}, different "
        f"SentencePiece models); speculative decoding compares the two "
        f"models' distributions id by id, so both must use one tokenizer")


def check_fits_model(tok: Tokenizer, model_vocab: int, what: str) -> None:
  """Raises unless every tokenizer id exists in the model's embedding."""
  if tok.vocab_size > model_vocab:
    raise ValueError(f"the tokenizer has {tok.vocab_size} ids but the {what} "
                     f"embeds only {model_vocab}; use the model's tokenizer")


def train(texts: Iterable[str], vocab_size: int, family: str = "t5",
          path: str | None = None, model_type: str = "unigram",
          extra_ids: int | None = None, **options) -> Tokenizer:
  """Trains a SentencePiece model with the family's special ids.

  Args:
    texts: training sentences.
    vocab_size: number of pieces (specials included, extra ids excluded).
    family: a family of models/families.py ('t5', 'gemma').
    path: optional path to write the ``.model`` file to.
    model_type: 'unigram' or 'bpe'.
    extra_ids: T5 sentinels (default 100 for t5, 0 for gemma).
    **options: more SentencePieceTrainer options.

  Returns:
    The Tokenizer.
  """
  _check_family(family)
  buf = io.BytesIO()
  kw = dict(LAYOUTS[family])
  kw.update(families.get(family).special_pieces)
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(texts), model_writer=buf, vocab_size=vocab_size,
      model_type=model_type, character_coverage=1.0,
      byte_fallback=options.pop("byte_fallback", True),
      minloglevel=options.pop("minloglevel", 2),
      hard_vocab_limit=False, **kw, **options)
  tok = Tokenizer(buf.getvalue(), family, extra_ids)
  if path:
    tok.save(path)
  return tok
