"""Model-agnostic decoding: samplers, targets T(q, p), loops and the API.

Nothing here imports a model family; models are reached only through the
decode interface (``specdec_jax.models.interface``).
"""

from specdec_jax.decoding.api import DecodeResult, generate
from specdec_jax.decoding.kernel import BlockResult, verify_block
from specdec_jax.decoding.methods import (METHODS, BiLD, DrafterOnly,
                                          OracleCascade, SeqCascade,
                                          Speculative, TargetOnly,
                                          TokenCascade, make_method)
from specdec_jax.decoding.program import clear_compiled
from specdec_jax.decoding.sampling import (Greedy, Temperature, TopK, TopP,
                                           sample)
from specdec_jax.decoding.targets import (OPT, BiLDRollback, BiLDStar, Chow,
                                          Diff, Lossy, LossyGreedy,
                                          SpecDecode, TokenV1, TokenV2,
                                          TokenV3, effective)

__all__ = [
    "BiLD", "BiLDRollback", "BiLDStar", "BlockResult", "Chow", "DecodeResult",
    "Diff", "DrafterOnly", "Greedy", "Lossy", "LossyGreedy", "METHODS", "OPT",
    "OracleCascade", "SeqCascade", "SpecDecode", "Speculative", "TargetOnly",
    "Temperature", "TokenCascade", "TokenV1", "TokenV2", "TokenV3", "TopK",
    "TopP", "clear_compiled", "effective", "generate", "make_method", "sample", "verify_block",
]
