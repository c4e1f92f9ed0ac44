"""scripts/bench_tree_feeds.py: tree names and the report table (the timed
run itself is a benchmark, not a test)."""


import pytest

from tests import load_script



def _load():
  return load_script("bench_tree_feeds", "bench_tree_feeds_under_test")


def test_tree_names_and_report():
  mod = _load()
  trees = mod.trees(["chain8", "kary2-16"])
  assert trees["chain8"].topology.is_chain
  assert trees["chain8"].topology.num_nodes == 8
  assert trees["chain8"].proposal == "top_k"  # stays on the tree loop
  assert trees["kary2-16"].topology.num_nodes == 16
  assert trees["kary2-16"].topology.max_children == 2
  with pytest.raises(ValueError, match="unknown tree 'ring4'"):
    mod.trees(["ring4"])
  row = dict(pair="p", batch=1, temperature=1.0, tree="chain8", nodes=8,
             depth=8, prefix_tokens_per_s=100.0, level_tokens_per_s=120.0,
             speedup=1.2, identical_requests=0.5)
  md = mod.markdown("cmd", dict(backend="cpu", cpu="x", jax="0"), [row])
  assert "| p | 1 | 1 | chain8 | 8 | 8 | 100.0 | 120.0 | 1.20x | 50% |" in md
