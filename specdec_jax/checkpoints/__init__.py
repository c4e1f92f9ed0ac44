"""Checkpoint readers and writers: native, HF safetensors, T5X, official Gemma.

    from specdec_jax import checkpoints
    model, params = checkpoints.load(path, model=None, dtype="bfloat16",
                                     sharding=None)
    checkpoints.save(path, model, params, format="hf")
    report = checkpoints.verify(path)   # checksums, NaN/inf, statistics

See ``loader.py`` for the formats and the leaf-by-leaf restore, and
``checksums.py`` for the per-tensor checksum manifest every save writes and
every load checks.
"""

from specdec_jax.checkpoints.gemma_official import load_gemma, save_gemma
from specdec_jax.checkpoints.hf import load_hf, save_hf
from specdec_jax.checkpoints.loader import (FORMATS, Leaf, detect_format, load,
                                            restore, save)
from specdec_jax.checkpoints.checksums import ChecksumError
from specdec_jax.checkpoints.t5x import (detect_t5x_format, load_t5x,
                                         load_t5x_tree)
from specdec_jax.checkpoints.t5x_write import save_t5x
from specdec_jax.checkpoints.verify import VerifyReport, verify

__all__ = [
    "ChecksumError", "FORMATS", "Leaf", "VerifyReport", "detect_format",
    "detect_t5x_format", "load", "load_gemma", "load_hf", "load_t5x", "load_t5x_tree", "restore", "save",
    "save_gemma", "save_hf", "save_t5x", "verify",
]
