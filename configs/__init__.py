"""ml_collections presets: model sizes and experiment sweeps."""
