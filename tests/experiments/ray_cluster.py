"""A local Ray cluster for a test module: its workers see the module's own model cache and no network."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import ray  # the dev extra has it: a quick suite without Ray fails here rather than skipping the sweeps


def local_cluster(tmp_path_factory: pytest.TempPathFactory, **resources: Any) -> Iterator[Any]:
    """Start Ray with `resources` (num_cpus, num_gpus: logical ones work without a GPU), yield it, stop it."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in {"PURPLERL_CACHE": str(tmp_path_factory.mktemp("cache")), "HF_HUB_OFFLINE": "1",
                            "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}.items():
            patch.setenv(name, value)
        ray.init(**resources, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
        try:
            yield ray
        finally:
            ray.shutdown()
