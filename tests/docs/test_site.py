"""The documentation site (mkdocs.yml, docs/): `mkdocs build --strict` as `make docs` runs it, in a subprocess, and
what the build makes from purplerl itself: every recipe's and orchestrator's settings table, the report screenshots
taken in headless Chromium, and the API reference of the extension points."""

from __future__ import annotations

import importlib.util
import inspect
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from purplerl.cli import app
from purplerl.cli.base import settings_sections
from purplerl.config import load_command_config
from purplerl.engines.base import Engine

ROOT = Path(__file__).parents[2]
DOCS_PACKAGES = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python", "pymdownx")
MISSING = [name for name in DOCS_PACKAGES if importlib.util.find_spec(name.split(".")[0]) is None
           or importlib.util.find_spec(name) is None]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# each settings table (the command and options of its `<!-- settings: ... -->`), its page, and one setting a reader
# of that page looks for
PAGES = {
    "attack": ("recipes/attack", "reward.kl_beta"),
    "defend": ("recipes/defend", "defend.noiser_every"),
    "sft": ("recipes/sft", "sft.eval_every"),
    "align": ("recipes/sft", "align.eval"),
    "prefs": ("recipes/prefs", "prefs.beta"),
    "reward-model": ("recipes/reward-model", "reward_model.ensemble"),
    "prm": ("recipes/reward-model", "prm.separator"),  # reward-model and prm share a page
    "ppo": ("recipes/ppo", "critic.vf_coef"),
    "route": ("recipes/route", "route.mode"),
    "adversarial": ("recipes/adversarial", "adversarial.gamma"),
    "pipeline": ("orchestrators/pipeline", "out"),
    "sweep": ("orchestrators/sweep", "recipe"),
    "tamper-test --threats merged,adapter,sft,adaptive": ("orchestrators/tamper-test", "tamper.entropy_bonus_cap"),
    "eval": ("evaluation", "judges.terms"),
}

pytestmark = [pytest.mark.process,
              pytest.mark.skipif(bool(MISSING), reason=f"the docs extra is not installed (no {', '.join(MISSING)}): "
                                                       "make docs installs it")]


def _build(site: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "NO_MKDOCS_2_WARNING": "1", "HF_HUB_OFFLINE": "1", **env}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(ROOT / "mkdocs.yml"), "--site-dir", str(site)],
                          capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    screenshots = "1" if shutil.which("chromium") or shutil.which("chromium-browser") else "0"
    done = _build(out, {"PURPLERL_DOCS_SCREENSHOTS": screenshots})
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def _settings_of(spec: str):
    """(the settings of the command `spec` names, the options after its name), found in the CLI's own command tree
    as the site's hook finds them."""
    node, words = typer.main.get_command(app), spec.split()
    while words and not words[0].startswith("--"):
        node, words = node.commands[words[0]], words[1:]
    return node.settings(), words


def _page(site: Path, name: str) -> str:
    return (site / name / "index.html").read_text(encoding="utf-8")


@pytest.mark.parametrize("spec", list(PAGES))
def test_each_page_lists_every_setting_its_command_reads(site: Path, spec: str) -> None:
    page, wanted = PAGES[spec]
    html = _page(site, page)
    assert "Generated from the settings tree" in html and f"<code>--{wanted}</code>" in html
    command, options = _settings_of(spec)
    names = [name for _, _, rows, _ in settings_sections(command, load_command_config(command, None, options))
             for name, *_ in rows]
    assert len(names) >= 3
    missing = [name for name in names if f"<code>--{name}</code>" not in html]
    assert missing == [], f"{page} lacks {missing}"


def test_the_attack_table_shows_its_default_reward_and_term_parameters(site: Path) -> None:
    html = _page(site, "recipes/attack")
    assert "<code>--reward.terms.toxicity.params.model</code>" in html
    assert "<code>--reward.kl_beta</code> (<code>--kl_beta</code>)" in html  # the short name beside it
    assert "Bookkeeping: logging, run" in html  # folded, but there


@pytest.mark.skipif(shutil.which("chromium") is None and shutil.which("chromium-browser") is None,
                    reason="needs Chromium for the screenshots (Debian: apt-get install chromium)")
def test_the_report_screenshots_are_pngs_on_the_evaluation_page(site: Path) -> None:
    for name in ("eval", "run"):
        shot = site / "assets" / f"report-{name}.png"
        data = shot.read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 10_000, shot
        assert f'src="../assets/report-{name}.png"' in _page(site, "evaluation")


def test_the_api_reference_has_every_method_of_the_engine_protocol(site: Path) -> None:
    html = _page(site, "api")
    methods = [name for name, _ in inspect.getmembers(Engine) if not name.startswith("_")]
    assert {"sample", "logprobs", "forward_backward", "optim_step", "save", "load"} <= set(methods)
    missing = [name for name in methods if f'id="purplerl.engines.base.Engine.{name}"' not in html]
    assert missing == []
    for documented in ("purplerl.algorithms.registry.register_loss", "purplerl.rewards.registry.register_term",
                       "purplerl.train.recipe.Recipe"):
        assert f'id="{documented}"' in html


def test_a_strict_build_without_chromium_fails_in_one_line_naming_it(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"  # PATH without a browser: the interpreter only
    bin_dir.mkdir()
    done = _build(tmp_path / "site", {"PATH": str(bin_dir), "PURPLERL_DOCS_SCREENSHOTS": "1"})
    assert done.returncode != 0
    assert "no chromium on PATH" in done.stderr and "PURPLERL_DOCS_SCREENSHOTS=0" in done.stderr
