"""Sampling transforms, target distributions T(q, p), cascades and keys."""
