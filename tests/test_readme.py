"""The README's two commands stay what CI and users run."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _commands() -> list[str]:
    return re.findall(r"```sh\n(.+?)\n```", (ROOT / "README.md").read_text())


def test_readme_starts_with_two_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    commands = _commands()
    assert len(commands) >= 2
    # Nothing but the title comes before the two commands.
    head = readme.split("```sh")[0].strip().splitlines()
    assert head == ["# voxgate"]
    assert "voxgate serve" in commands[0] and "--engine piper" in commands[0] and "8000" in commands[0]
    assert "[test]" in commands[1] and "pytest" in commands[1]


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert _commands()[1] in ci.splitlines()


def test_licence_warnings_are_stated() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "GPL-3.0" in readme and "commercial" in readme


def test_the_settings_table_is_generated_from_the_declared_settings() -> None:
    from voxgate.gateway.settings import markdown_table

    readme = (ROOT / "README.md").read_text()
    found = re.search(r"<!-- settings table: [^\n]*-->\n(.*?)<!-- end of settings table -->", readme, re.S)
    assert found, "README.md lost its settings table markers"
    assert found.group(1) == markdown_table(), (
        "README's settings table is stale: run python -m voxgate.gateway.settings"
    )
