"""Tests of tools/ (developer tools outside the installed package)."""
