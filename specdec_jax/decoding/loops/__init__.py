"""Decode loops: state, drafting, speculative / sequential / tree / hierarchy loops, drivers."""
