"""`make mutation`'s list stays true to the code: a refactor that moves a mutated snippet, or a test file a
mutation runs, fails here (in `make test`) instead of rotting until the next mutation run."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _script():
    spec = importlib.util.spec_from_file_location("mutation_list", ROOT / "scripts" / "mutation_list.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def test_every_mutation_snippet_occurs_once_in_its_file():
    script = _script()
    assert script.snippet_problems(script.MUTATIONS, ROOT) == []


def test_every_mutation_names_tests_that_exist_and_differs_from_its_original():
    script = _script()
    names = [m.name for m in script.MUTATIONS]
    assert len(names) == len(set(names))
    for m in script.MUTATIONS:
        assert m.mutated != m.original, m.name
        assert m.tests, m.name
        missing = [t for t in m.tests if not (ROOT / t.split("::")[0]).is_file()]
        assert not missing, (m.name, missing)


def test_a_moved_snippet_is_reported(tmp_path: Path):
    script = _script()
    m = script.MUTATIONS[0]
    (tmp_path / m.path).parent.mkdir(parents=True)
    (tmp_path / m.path).write_text((ROOT / m.path).read_text().replace(m.original, m.original + "  # moved\n" +
                                                                       m.original))
    assert script.snippet_problems([m], tmp_path) == [f"{m.name}: snippet in {m.path} found 2 times; update the "
                                                      f"mutation list"]
