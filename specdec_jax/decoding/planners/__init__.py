"""Planners: choose draft shapes from measured acceptance and costs.

    tree_shape.py   Sequoia's dynamic program over tree shapes and the
                    hardware-aware choice of (nodes, depth)
    calibration.py  per-rank acceptance by replaying recorded (q, p) pairs,
                    measured drafter / verifier block costs on this machine
"""

from specdec_jax.decoding.planners.calibration import (Costs, calibrate,
                                                     measure_costs,
                                                     rank_acceptance)
from specdec_jax.decoding.planners.tree_shape import (Plan, best_tree,
                                                      expected_accepted,
                                                      plan_tree, rank_probs,
                                                      tree_gin)

__all__ = ["Costs", "Plan", "best_tree", "calibrate", "expected_accepted",
           "measure_costs", "plan_tree", "rank_acceptance", "rank_probs",
           "tree_gin"]
