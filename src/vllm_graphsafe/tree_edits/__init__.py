"""Edits to a vLLM source tree, as every fix's backport planner makes them:
the tree read from disk, each file parsed whole, edits located by parsing and
returned as a :class:`~vllm_graphsafe.tree_edits.plan.Plan`.

It imports nothing of the fixes: each fix's ``backport.py`` builds on it, and
:mod:`vllm_graphsafe.backport` applies, records and verifies what they plan.
"""
