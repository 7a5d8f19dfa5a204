"""`purplerl sweep`: the Cartesian grid x seeds of any recipe, each run a `purplerl RECIPE` subprocess scheduled
on Ray with its own CPU (and GPU) budget; after each run the diversity eval of its final checkpoint; then a table
of final metrics per configuration with 95% intervals over seeds and the template-collapse flag.

settings.py reads the sweep, plan.py names and validates its runs, state.py keeps the sweep dir (and what a rerun
resumes), execute.py and task.py run it on Ray, summary.py and report.py sum it up. Nothing here names a recipe:
every row of the recipe table can be swept, one added later included.

This package imports nothing itself: a Ray worker imports task.py, and each run's command starts through child.py,
neither of which should pay for torch.
"""
