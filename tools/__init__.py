"""Developer tools that live outside the installed specdec_jax package."""
