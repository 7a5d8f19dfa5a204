"""The test tiers of tests/conftest.py (README: Tests): the quick tier starts no process, the process tier may, and
every test starts on one torch thread whatever the test before it set."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys

import pytest
import torch
from conftest import workers


def test_the_quick_tier_stops_a_test_that_starts_a_process() -> None:
    with pytest.raises(pytest.fail.Exception, match=r"started a process \(.*-c pass\): mark it `process`"):
        subprocess.run([sys.executable, "-c", "pass"], check=True)


def test_the_quick_tier_stops_a_multiprocessing_child_too() -> None:
    with pytest.raises(pytest.fail.Exception, match="started a process"):
        multiprocessing.get_context("spawn").Process(target=print).start()


@pytest.mark.process
def test_the_process_tier_may_start_one_within_its_share_of_the_cores(pytestconfig: pytest.Config) -> None:
    threads = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                             capture_output=True, text=True, check=True).stdout
    cores = os.cpu_count() or 1
    assert 1 <= int(threads) * workers(pytestconfig) <= max(cores, workers(pytestconfig)), (threads, cores)


@pytest.mark.parametrize("threads", [2, 1])
def test_every_test_starts_on_one_torch_thread(threads: int) -> None:
    assert torch.get_num_threads() == 1
    torch.set_num_threads(threads)  # the next case must find 1 again
