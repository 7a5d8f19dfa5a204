"""The alignment data of `purplerl align`: harmful requests with refusals, and benign requests that the
model answers itself (self-distillation), all written by this project and generated deterministically.

Requests are templates x topics (templates.py; harmful_*.py and benign_*.py); refusals are composed from
refusals.py; build.py splits, generates and hashes. The test split holds out whole templates and whole
topics. `alignment_data_hash()` is the cache key of a model aligned on this data.
"""

from purplerl.data.alignment.build import (
    KINDS,
    SPLITS,
    VERSION,
    AlignExample,
    alignment_data_hash,
    alignment_examples,
    benign_topics,
    harmful_topics,
    split_templates,
    split_topics,
    to_prompt_records,
)

__all__ = ["KINDS", "SPLITS", "VERSION", "AlignExample", "alignment_data_hash", "alignment_examples",
           "benign_topics", "harmful_topics", "split_templates", "split_topics", "to_prompt_records"]
