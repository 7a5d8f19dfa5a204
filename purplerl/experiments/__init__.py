"""Experiments: what runs recipes and evaluations together (the tamper-resistance test).

The layer above `recipes/` and `eval/` and below the CLI, so that no recipe imports another recipe or `eval/`.
"""
