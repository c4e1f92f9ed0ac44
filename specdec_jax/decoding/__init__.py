"""Model-agnostic decoding: samplers, targets T(q, p), loops and the API.

Nothing here imports a model family; models are reached only through the
decode interface (``specdec_jax.models.interface``). Layout:

    strategy.py           the strategy value: method + structure (Chain,
                          Tree, Stack) + sampling
    api.py                decode(strategy, models, params, ...): the ONE
                          request path; generate() (a thin wrapper)
    budget.py             the cache-capacity formula and the memory check
    request.py, inputs.py its steps (prep, config, program dispatch) and the
                          host-side input checks; result.py DecodeResult
    registry.py           the ONE table of methods (names, knobs, labels, grids)
    methods.py            method = static rule + traced knobs -> loop program
    rules/                sampling transforms, targets T(q, p), cascades, keys
    verify/               draft topologies and the verification kernels
    loops/                loop state, drafting, the chain / tree / sequential
                          loops, the compile-and-run drivers
    drafting.py           Drafting: a fixed set of models + a structure, for
                          adapters that trace the loop (t5x, serving)
    hierarchy/            hierarchical speculative decoding (a stack of K
                          drafters, ``generate_hierarchy``), its latency model
                          and planner
    planners/             measured inputs of the planners (acceptance, costs)
"""

from specdec_jax.decoding.api import DecodeResult, decode, generate
from specdec_jax.decoding.drafting import Drafting
from specdec_jax.decoding.hierarchy.api import generate_hierarchy
from specdec_jax.decoding.loops.program import clear_compiled
from specdec_jax.decoding.methods import (BiLD, DrafterOnly, OracleCascade,
                                          SeqCascade, Speculative, TargetOnly,
                                          TokenCascade)
from specdec_jax.decoding.registry import METHODS, REGISTRY, make_method
from specdec_jax.decoding.rules.cascades import (OPT, BiLDStar, Chow, Diff,
                                                 TokenV1, TokenV2, TokenV3)
from specdec_jax.decoding.rules.sampling import (Greedy, Temperature, TopK,
                                                 TopP, sample)
from specdec_jax.decoding.strategy import Chain, Stack, Strategy
from specdec_jax.decoding.rules.targets import (BiLDRollback, Lossy,
                                                LossyGreedy, SpecDecode,
                                                effective)
from specdec_jax.decoding.verify.chain import BlockResult, verify_block
from specdec_jax.decoding.verify.topology import Topology
from specdec_jax.decoding.verify.tree import Tree, TreeResult, verify_tree

__all__ = [
    "BiLD", "BiLDRollback", "BiLDStar", "BlockResult", "Chain", "Chow",
    "DecodeResult", "Drafting", "Stack", "Strategy", "decode",
    "Diff", "DrafterOnly", "Greedy", "Lossy", "LossyGreedy", "METHODS", "OPT",
    "OracleCascade", "REGISTRY", "SeqCascade", "SpecDecode", "Speculative",
    "TargetOnly", "Temperature", "TokenCascade", "TokenV1", "TokenV2",
    "TokenV3", "TopK", "TopP", "Topology", "Tree", "TreeResult",
    "clear_compiled", "effective", "generate", "generate_hierarchy",
    "make_method", "sample",
    "verify_block", "verify_tree",
]
