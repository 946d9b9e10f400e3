"""Validation against measured runs and the independent checks (published runs never fitted to)."""
