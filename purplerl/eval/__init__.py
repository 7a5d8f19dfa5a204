"""Evaluation suites: harm, utility and diversity measurements of a model before and after RL.

`utility` checks that a defended (or attacked) model can still do benign work: short math word problems
scored by exact match of the final number, GSM8K style, multiple choice by option log-likelihood, and (asked for)
MATH-style chain-of-thought problems scored by their boxed answer. A tamper-resistance result only counts when the
defense keeps this accuracy.
"""

from purplerl.eval.utility import exact_match, extract_answer, load_utility_set, score_utility, utility_prompts

__all__ = ["exact_match", "extract_answer", "load_utility_set", "score_utility", "utility_prompts"]
