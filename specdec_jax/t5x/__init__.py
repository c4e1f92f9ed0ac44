"""Adapters to t5x (import-guarded: nothing here needs t5x to import).

* ``decoding``: a t5x ``decode_fn`` (DecodeFnCallable) for the single-model
  baselines.
* ``models``: t5x Models running speculative decoding / cascades with a
  drafter and a verifier, drafting chains, token trees or hierarchies.
* ``drafting``: those three drafting options (``Hierarchy`` of early exits).
* ``merge``: merges two T5X checkpoints into the one these Models restore.
* ``metrics``: a seqio metric of the Models' acceptance statistics.

See docs/t5x.md.
"""
