"""purplerl: LLM safety research with reinforcement learning (attack, defend, evaluate)."""

__version__ = "0.1.0"
