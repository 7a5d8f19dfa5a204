"""Where a step function is in its data, kept with each checkpoint.

Most recipes' batches are a pure function of (data, seed, step) (purplerl.data.sft.LengthBuckets, the prompt
sampler), so the checkpoint's step number says where a resumed run goes on. A streamed source
(purplerl.data.stream) is read in one pass and cannot be indexed by step: its step function carries its position
(`Positioned`), which the loop saves in each checkpoint's state (under "data") and the runner hands back after the
engine has loaded the checkpoint, so the resumed run continues at the exact next example.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from purplerl.errors import UserError

STATE_KEY = "data"


@runtime_checkable
class Positioned(Protocol):
    """A step function (step -> (metrics, sample rows)) that knows where it is in its data."""

    def __call__(self, step: int) -> tuple[dict[str, float], list[dict[str, Any]]]: ...

    def position(self) -> dict[str, Any]:
        """Where the next step starts, as JSON data."""
        ...

    def seek(self, position: dict[str, Any]) -> None:
        """Continue from a position `position()` gave."""
        ...


def position_of(step_fn: Any) -> dict[str, Any]:
    """What a checkpoint's state keeps of the step function: {"data": its position}, or nothing."""
    return {STATE_KEY: step_fn.position()} if isinstance(step_fn, Positioned) else {}


def restore_position(step_fn: Any, state: dict[str, Any], checkpoint: Path) -> None:
    """Move a positioned step function to where the checkpoint's state says its data stood."""
    if not isinstance(step_fn, Positioned):
        return
    position = state.get(STATE_KEY)
    if not isinstance(position, dict):
        raise UserError(f"{checkpoint} holds no data position, which a streamed run resumes from: resume from a "
                        "checkpoint of a streamed run, or start a new run with --name NEW")
    step_fn.seek(position)
