"""Judges shipped with core; registered by core's default plugin."""
