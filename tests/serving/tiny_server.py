"""A server over the tiny random stack of the serving tests (a process).

    python -m tests.serving.tiny_server PORT
"""

import sys

from specdec_jax.serving import cli
from specdec_jax.serving.server import serve
from tests.serving import common

ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456 "


class CharTokenizer:
  """ids 3..62 <-> one character each (0 pad, 1 eos, 2 bos; 63 no text)."""

  def encode(self, text):
    bad = [c for c in text if c not in ALPHABET]
    if bad:
      raise ValueError(f"character {bad[0]!r} is not in the test alphabet")
    return [2] + [3 + ALPHABET.index(c) for c in text]

  def decode(self, ids):
    return "".join(ALPHABET[i - 3] for i in ids if 3 <= i < 3 + len(ALPHABET))


def main(port: int) -> None:
  app = cli.build_app(common.levels(), CharTokenizer(), model="tiny",
                      slots=2, max_prompt=16, max_tokens=12, steps=2,
                      max_pools=8, max_queue=40, request_timeout_s=300.0,
                      drain_s=2.0)
  serve(app, port=port, graceful_s=2.0)


if __name__ == "__main__":
  main(int(sys.argv[1]))
