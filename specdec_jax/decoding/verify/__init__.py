"""Draft topologies and the verification kernels (chain, tree)."""
