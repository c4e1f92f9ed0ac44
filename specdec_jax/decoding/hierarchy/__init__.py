"""Hierarchical speculative decoding: the stacked loop, its latency model and
the planner that picks the hierarchy (HSD, Globerson et al.)."""
