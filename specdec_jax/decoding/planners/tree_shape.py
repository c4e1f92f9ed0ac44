"""Tree-shape planner: Sequoia's dynamic program, hardware-aware.

Model (Sequoia, Chen et al. 2024; ../shared/reference/trees-and-hierarchies.md
section 2.4): at every node the child of rank j is accepted, given that the
children before it were rejected, with probability a_j (calibrated per rule,
temperature and proposal kind by ``calibration.rank_acceptance``), so child j
is THE accepted child with probability

    P_j = a_j * prod_{i < j} (1 - a_i),

independently of the node. A node is on the accepted path with the product
of P over its ranks along the root-to-node path, and the expected number of
accepted nodes of a tree is the sum of those products. The best tree with at
most n nodes and depth <= d has value A(n, d):

    A(n, d) = F(n, d, 0),   A(0, d) = A(n, 0) = 0
    F(n, d, j) = max(0, max_{1 <= s <= n} P_j (1 + A(s - 1, d - 1))
                                          + F(n - s, d, j + 1))

(s = the size of the subtree of the rank-j child), O(N^2 D K) for N nodes,
depth D and K calibrated ranks. Tokens per verifier call = 1 + A(n, d).

Hardware-aware choice: with measured costs (``calibration.Costs``) of a
drafter block of w tokens c_q(w) and a verifier block c_p(w), one block of a
tree with N nodes, depth D and at most C children costs

    sum_k c_q(F_k) + c_p(N + 1)    (+ the loop's: h + N h_node + D h_depth)

with F_k the tokens compiled drafter call k feeds (``verify.tree.
tree_feed_widths``: the depth-k level for a level-fed drafter, the block
prefix of depth <= k otherwise; k = 0..D when the drafter commits the
tree, 0..D-1 when it catches up, call 0 then feeding 2 tokens: the catch-up
slot and the root, ``loops/tree_drafting.py``). The plan
minimises cost per token over every (n, d); its predicted speedup is the
target-only cost per token c_p(1) over that.

Worked example (tested): a = (0.6, 0.3), n = 3, d = 2. P = (0.6, 0.12).
A(1, 1) = 0.6, A(2, 1) = 0.72 (two children), A(2, 2) = 0.6 (1 + 0.6) =
0.96 (a chain beats two siblings), A(3, 2) = max(0.6 (1 + A(2, 1)) = 1.032,
0.6 (1 + A(1, 1)) + 0.12 = 1.08) = 1.08: the root's first child has one
child, the root has a second child.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from specdec_jax.decoding.verify import tree as tree_lib
from specdec_jax.decoding.verify.topology import Topology


MAX_PLAN_NODES = 1024
"""The largest tree the planner searches: the dynamic program is
O(N^2 D K) in pure Python (measured: 0.3 s at 256 nodes, 1.2 s at 512,
~5 s at 1,024; 5,000 nodes ran past 5 minutes)."""
MAX_PLAN_DEPTH = 64
MAX_PLAN_SHAPES = 16384
"""With costs, every (nodes, depth) budget is built and costed once."""


def check_search(max_nodes: int, max_depth: int, min_nodes: int,
                 costed: bool) -> None:
  """Refuses a search beyond the documented bounds, before it starts."""
  for name, x, hi in (("max_nodes", max_nodes, MAX_PLAN_NODES),
                      ("max_depth", max_depth, MAX_PLAN_DEPTH)):
    if isinstance(x, bool) or not isinstance(x, int) or x > hi:
      raise ValueError(f"{name} must be an integer <= {hi:,} (the tree "
                       f"planner's bound, tree_shape.MAX_PLAN_"
                       f"{name[4:].upper()}), got {x!r}; plan a smaller tree")
  shapes = (max_nodes - min_nodes + 1) * max_depth
  if costed and shapes > MAX_PLAN_SHAPES:
    raise ValueError(f"max_depth x (max_nodes - min_nodes + 1) = {shapes:,} "
                     f"tree budgets to cost, more than {MAX_PLAN_SHAPES:,} "
                     f"(tree_shape.MAX_PLAN_SHAPES); raise min_nodes or lower "
                     f"max_nodes / max_depth")


def rank_probs(acceptance: Sequence[float]) -> tuple[float, ...]:
  """P_j = a_j prod_{i<j} (1 - a_i): child j is the accepted one."""
  out, rest = [], 1.0
  for a in acceptance:
    a = float(a)
    if not 0.0 <= a <= 1.0:
      raise ValueError(f"acceptance rates must be in [0, 1], got {a}")
    out.append(rest * a)
    rest *= 1.0 - a
  return tuple(out)


def expected_accepted(topology: Topology,
                      acceptance: Sequence[float]) -> float:
  """E[accepted nodes] of ``topology`` under i.i.d. per-rank acceptance."""
  probs = rank_probs(acceptance) + (0.0,) * topology.max_children
  reach = []
  for parent, rank in zip(topology.parents, topology.ranks):
    reach.append(probs[rank] * (1.0 if parent < 0 else reach[parent]))
  return float(sum(reach))


def tokens_dist(topology: Topology,
                acceptance: Sequence[float]) -> tuple[float, ...]:
  """P(a block emits k tokens), k = 1..D + 1, under per-rank acceptance.

  At most one node per depth lies on the accepted path, so P(depth >= d)
  is the sum of the reach probabilities of the depth-d nodes (as in
  :func:`expected_accepted`); a block emits its accepted depth + 1 tokens.
  Its mean is 1 + expected_accepted.
  """
  probs = rank_probs(acceptance) + (0.0,) * topology.max_children
  reach = []
  at_least = [1.0] + [0.0] * topology.max_depth  # [D + 1]
  for parent, rank, depth in zip(topology.parents, topology.ranks,
                                 topology.depths):
    reach.append(probs[rank] * (1.0 if parent < 0 else reach[parent]))
    at_least[depth] += reach[-1]
  return tuple(max(at_least[m] - (at_least[m + 1] if m < len(at_least) - 1
                                  else 0.0), 0.0)
               for m in range(len(at_least)))


def _tables(probs: Sequence[float], nodes: int, depth: int):
  """A[d][n] and the argmax subtree sizes choice[(n, d, j)] (0: stop)."""
  k = len(probs)
  big_a = [[0.0] * (nodes + 1) for _ in range(depth + 1)]
  choice = {}
  for d in range(1, depth + 1):
    f = [[0.0] * (nodes + 1) for _ in range(k + 1)]  # f[j][n]
    for j in range(k - 1, -1, -1):
      for n in range(1, nodes + 1):
        best, arg = 0.0, 0
        for s in range(1, n + 1):
          v = probs[j] * (1.0 + big_a[d - 1][s - 1]) + f[j + 1][n - s]
          if v > best + 1e-15:
            best, arg = v, s
        f[j][n], choice[n, d, j] = best, arg
    big_a[d] = f[0]
  return big_a, choice


def _build(choice, n: int, d: int, k: int) -> list:
  """Nested children lists of the optimal tree (each entry a subtree)."""
  kids, j = [], 0
  while j < k and n > 0 and d > 0:
    s = choice.get((n, d, j), 0)
    if s == 0:
      break
    kids.append(_build(choice, s - 1, d - 1, k))
    n, j = n - s, j + 1
  return kids


def _topology(nested: list) -> Topology | None:
  """Breadth-first Topology of nested children lists (rank = order)."""
  parents, queue = [], [(-1, nested)]
  while queue:
    parent, kids = queue.pop(0)
    for sub in kids:
      parents.append(parent)
      queue.append((len(parents) - 1, sub))
  return Topology(tuple(parents)) if parents else None


def best_tree(acceptance: Sequence[float], nodes: int,
              depth: int) -> tuple[float, Topology | None]:
  """The tree with at most ``nodes`` nodes and depth <= ``depth`` that
  maximises the expected accepted nodes, and that expectation.

  Args:
    acceptance: per-rank acceptance a_0, a_1, ... (its length bounds the
      children per node).
    nodes, depth: budgets (>= 1).

  Returns:
    (A(nodes, depth), Topology or None when no node helps).
  """
  if nodes < 1 or depth < 1:
    raise ValueError(f"nodes and depth must be >= 1, got nodes={nodes}, "
                     f"depth={depth}")
  probs = rank_probs(acceptance)
  big_a, choice = _tables(probs, nodes, depth)
  return big_a[depth][nodes], _topology(_build(choice, nodes, depth,
                                               len(probs)))


@dataclasses.dataclass(frozen=True)
class Plan:
  """A planned tree.

  Attributes:
    topology: the chosen tree.
    tokens_per_call: predicted tokens per verifier call (1 + A).
    seconds_per_call: predicted seconds of one block (None without costs).
    predicted_speedup: target-only seconds per token over the tree's
      (None without costs).
    candidates: one dict per (nodes, depth) considered (nodes, depth,
      children, tokens_per_call, seconds_per_token, speedup).
  """

  topology: Topology
  tokens_per_call: float
  seconds_per_call: float | None = None
  predicted_speedup: float | None = None
  candidates: tuple = ()


def block_seconds(topology: Topology, costs, sync: str = "commit") -> float:
  """Predicted seconds of one tree block with measured ``costs``."""
  n, d = topology.num_nodes, topology.max_depth
  feeds = tree_lib.tree_feed_widths(
      topology, getattr(costs, "drafter_level_fed", True))
  if sync == "commit":
    total = sum(costs.drafter(feeds[k]) for k in range(d + 1))
  else:  # calls 0..D-1; call 0 is a 2-token block (catch-up slot + root)
    total = costs.drafter(feeds[0] + 1) + sum(
        costs.drafter(feeds[k]) for k in range(1, d))
  return (total + costs.verifier(n + 1) + costs.overhead
          + n * getattr(costs, "node_overhead", 0.0)
          + d * getattr(costs, "depth_overhead", 0.0))


def plan_tree(acceptance: Sequence[float], costs=None, max_nodes: int = 32,
              max_depth: int = 8, sync: str = "commit",
              min_nodes: int = 1) -> Plan:
  """Chooses the tree shape.

  Without ``costs``: the Sequoia-optimal tree of exactly the budget
  (max_nodes, max_depth), i.e. most tokens per verifier call. With
  ``costs``: the (n, d) with the fewest predicted seconds per token, n in
  [min_nodes, max_nodes], d <= max_depth.

  Args:
    acceptance: per-rank acceptance (``calibration.rank_acceptance``).
    costs: ``calibration.Costs``, a ``costs.CostModel`` (its drafter 0 and
      target, ``tree_costs()``) or None.
    max_nodes, max_depth: budgets.
    sync: the drafter sync the tree will run with ('commit' / 'catchup').
    min_nodes: smallest node count considered.

  Returns:
    Plan.
  """
  if max_nodes < 1 or max_depth < 1 or not 1 <= min_nodes <= max_nodes:
    raise ValueError(f"need 1 <= min_nodes <= max_nodes and max_depth >= "
                     f"1, got {min_nodes}, {max_nodes}, {max_depth}")
  if hasattr(costs, "tree_costs"):  # a costs.CostModel
    costs = costs.tree_costs()
  check_search(max_nodes, max_depth, min_nodes, costs is not None)
  probs = rank_probs(acceptance)
  big_a, choice = _tables(probs, max_nodes, max_depth)
  if costs is None:
    topo = _topology(_build(choice, max_nodes, max_depth, len(probs)))
    if topo is None:
      raise ValueError(f"no tree helps: acceptance {list(acceptance)}")
    return Plan(topo, 1.0 + big_a[max_depth][max_nodes])
  best, rows = None, []
  for d in range(1, max_depth + 1):
    for n in range(min_nodes, max_nodes + 1):
      topo = _topology(_build(choice, n, d, len(probs)))
      if topo is None or topo.num_nodes != n or topo.max_depth != d:
        continue  # the same tree is reached with a smaller budget
      tokens = 1.0 + big_a[d][n]
      secs = block_seconds(topo, costs, sync)
      row = dict(nodes=n, depth=d, children=topo.max_children,
                 tokens_per_call=tokens, seconds_per_token=secs / tokens,
                 speedup=costs.verifier(1) / (secs / tokens))
      rows.append(row)
      if best is None or row["seconds_per_token"] < best[0][
          "seconds_per_token"]:
        best = (row, topo, secs)
  if best is None:
    raise ValueError(f"no tree helps: acceptance {list(acceptance)}")
  row, topo, secs = best
  return Plan(topo, row["tokens_per_call"], secs, row["speedup"],
              tuple(rows))


def tree_gin(topology: Topology, proposal: str = "without_replacement",
             note: str = "") -> str:
  """A gin file that makes decode runs use ``topology`` (gin/trees/)."""
  parents = ", ".join(str(p) for p in topology.parents)
  parents += "," if topology.num_nodes == 1 else ""
  lines = [
      f"# Tree: {topology.num_nodes} nodes, depth {topology.max_depth}, at "
      f"most {topology.max_children} children per node.",
  ]
  if note:
    lines += [f"# {ln}" for ln in note.splitlines()]
  lines += [
      "#",
      "# Include after runs/decode.gin (and a pair and a method): decode "
      "then drafts",
      "# this tree per block and verifies it in one verifier step.",
      "#",
      "# REQUIRED: none.",
      "# Commonly overridden:",
      "#   TREE_PROPOSAL   'without_replacement' | 'iid' | 'top_k'",
      f"TREE_PARENTS = ({parents})",
      f"TREE_PROPOSAL = '{proposal}'",
      "tree_spec.parents = %TREE_PARENTS",
      "tree_spec.proposal = %TREE_PROPOSAL",
      "run.tree = @tree_spec()",
  ]
  return "\n".join(lines) + "\n"
