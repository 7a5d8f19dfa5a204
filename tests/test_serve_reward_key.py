"""`purplerl serve-reward` warns, once, when the API key is an argument (which `ps` shows every user), and its
--help points to the environment variable."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from purplerl.cli import app

WARNING = ("warning: an API key on the command line is visible to every user of this machine (ps): set it by env "
           "PURPLERL_REWARD_API_KEY instead")
KEY = "s3cret-key"


def _serve(*args: str, env_key: str | None = None):
    # --port 70000 is refused before any model loads or port opens: the command ends right after its warnings
    return CliRunner().invoke(app, ["serve-reward", *args, "--port", "70000"],
                              env={"PURPLERL_REWARD_API_KEY": env_key})


@pytest.mark.parametrize("args", [["--api-key", KEY], [f"--api-key={KEY}"], ["--server.api_key", KEY],
                                  ["--server.api-key=" + KEY], ["--api-key", KEY, "--server.api_key", KEY]])
def test_a_key_on_the_command_line_warns_once(args: list[str]) -> None:
    result = _serve(*args)
    assert result.exit_code == 2
    assert result.stderr.splitlines().count(WARNING) == 1
    assert result.stderr.splitlines()[0] == WARNING
    assert KEY not in result.stderr  # the warning never repeats the key


def test_a_key_from_the_environment_does_not_warn() -> None:
    result = _serve(env_key=KEY)
    assert result.exit_code == 2 and "--port" in result.stderr
    assert "warning" not in result.stderr


def test_help_names_the_environment_variable_as_the_safe_way() -> None:
    result = CliRunner().invoke(app, ["serve-reward", "--help"], env={"COLUMNS": "200"})
    help_text = " ".join(result.output.split())
    assert "set it by env PURPLERL_REWARD_API_KEY, since on the command line every user of the machine sees it (ps)" \
        in help_text
