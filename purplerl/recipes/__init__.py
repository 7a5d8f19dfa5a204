"""Recipes: defaults + reward composition + a call to the loop."""
