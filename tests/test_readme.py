"""The README's two commands stay what CI and users run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

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


def _sections(readme: str) -> list[str]:
    return re.findall(r"^## (.+)$", readme, re.M)


def test_the_readme_says_what_voxgate_is_right_after_the_commands_then_features_then_figures() -> None:
    readme = (ROOT / "README.md").read_text()
    after = readme.split("```sh")[2].split("```", 1)[1]
    intro = after.split("\n## ", 1)[0].strip()
    assert intro.startswith("voxgate is a real-time voice gateway"), intro[:80]
    assert "\n\n" not in intro, "what voxgate is: one paragraph"
    sections = _sections(readme)
    assert sections[:4] == ["Install", "What it does", "Figures", "Documentation"], sections
    figures = readme.split("## Figures", 1)[1].split("\n## ", 1)[0]
    assert "(docs/performance.md)" in figures


def test_the_readme_says_how_to_install_a_package_that_is_not_on_pypi() -> None:
    install = (ROOT / "README.md").read_text().split("## Install", 1)[1].split("\n## ", 1)[0]
    assert "not published on PyPI" in install
    assert "git+" in install and "git clone" in install


def test_no_table_cell_is_a_wall_of_text() -> None:
    readme = (ROOT / "README.md").read_text()
    cells = [c.strip() for line in readme.splitlines() if line.startswith("|") for c in line.split(" | ")]
    longest = max(cells, key=len)
    assert len(longest) <= 600, f"{len(longest)} characters: {longest[:80]}..."


def test_the_route_table_names_every_audio_route() -> None:
    from starlette.routing import Route, WebSocketRoute
    from voxgate.gateway.app import create_app
    from voxgate.gateway.settings import Settings

    routes = create_app(Settings.from_env({})).routes
    paths = {
        r.path for r in routes if isinstance(r, Route | WebSocketRoute) and r.path.startswith("/v1/audio")
    }
    table = (ROOT / "README.md").read_text().split("## REST routes", 1)[1].split("\n## ", 1)[0]
    assert paths and all(f"{p}`" in table for p in paths), sorted(p for p in paths if f"{p}`" not in table)


def test_the_docs_map_links_every_doc() -> None:
    readme = (ROOT / "README.md").read_text()
    docs_map = readme.split("## Documentation", 1)[1].split("\n## ", 1)[0]
    for doc in sorted((ROOT / "docs").glob("*.md")):
        assert f"(docs/{doc.name})" in docs_map, doc.name


#: The pages whose text this test keeps clean (docs/performance.md, reliability.md and protocol.md keep
#: their own history for now).
READER_PAGES = ("README.md", "docs/deploy.md", "docs/gpu.md", "docs/agents.md", "docs/comparison.md")


@pytest.mark.parametrize("page", READER_PAGES)
def test_pages_cite_no_internal_issue_and_only_files_that_exist(page: str) -> None:
    text = (ROOT / page).read_text()
    issues = re.findall(r"\bissues? \d+|(?<![\w/.-])#\d{2,}\b", text)
    assert not issues, issues
    cited = set(
        re.findall(
            r"\b((?:bench|tests|examples|engine|gateway|protocol|web|\.ci)/[\w./-]*\.(?:py|sh|js))", text
        )
    )
    missing = sorted(path for path in cited if not (ROOT / path).exists())
    assert not missing, missing
