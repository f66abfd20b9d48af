"""Rewrite passes, one per module; ``levels.py`` assembles them into the default pipelines."""
