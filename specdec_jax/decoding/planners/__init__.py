"""Planners: choose draft shapes from measured acceptance and costs.

    tree_shape.py   Sequoia's dynamic program over tree shapes and the
                    hardware-aware choice of (nodes, depth)
    calibration.py  per-rank acceptance by replaying recorded (q, p) pairs,
                    measured drafter / verifier block costs on this machine
    costs.py        ONE cost model (CostModel): measured call costs by model
                    and block width, loop overheads by structure; prices
                    chains (best_gamma) and gives the tree / hierarchy
                    planners their inputs (tree_costs, call_costs)
    structure_fit.py
                    fits a tree's / hierarchy's acceptance scale, loop
                    overheads and fixed part from a few measured anchors
                    (CostModel.tree_decode / stack_decode then price the
                    other shapes)
    hierarchy_calibration.py
                    inputs of the hierarchy planner: pairwise alpha from one
                    teacher-forced pass, per-call costs by block width
    tuning.py       tune(): measure candidate strategies per batch size
                    (target-only, chains, trees, hierarchies, cascades)
                    and choose one per objective -> auto.AutoTable
    auto.py         the auto table (batch size -> strategy), its gin file,
                    and the row rule of decode(strategy='auto')
    tune_store.py   tuned tables kept in the per-user program store, keyed
                    by settings, calibration rows and model parameters
"""

from specdec_jax.decoding.planners.auto import AutoTable, load
from specdec_jax.decoding.planners.calibration import (Costs, calibrate,
                                                     measure_costs,
                                                     rank_acceptance)
from specdec_jax.decoding.planners.costs import CostModel
from specdec_jax.decoding.planners.hierarchy_calibration import (
    CallCosts, measure_call_costs, pairwise_alpha)
from specdec_jax.decoding.planners.tree_shape import (Plan, best_tree,
                                                      expected_accepted,
                                                      plan_tree, rank_probs,
                                                      tree_gin)
from specdec_jax.decoding.planners.tuning import tune

__all__ = ["AutoTable", "CallCosts", "CostModel", "Costs", "Plan",
           "best_tree", "calibrate", "expected_accepted", "load",
           "measure_call_costs", "measure_costs", "pairwise_alpha",
           "plan_tree", "rank_acceptance", "rank_probs", "tree_gin", "tune"]
