"""Tests of tools/default_models (the default-model factory)."""

import importlib


def load_tool(name: str):
  """Imports ``tools.default_models.<name>`` (a module of the factory)."""
  return importlib.import_module(f"tools.default_models.{name}")


__all__ = ["load_tool"]  # shared by this package's tests
