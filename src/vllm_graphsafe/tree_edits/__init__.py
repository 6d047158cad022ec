"""Edits to a vLLM source tree, located by parsing, as every fix's backport
planner makes them; it imports nothing of the fixes."""
