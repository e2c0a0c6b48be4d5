"""The README opens with the two commands, and CI runs the README's test command."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text("utf-8")
    block = text.split("```bash", 1)[1].split("```", 1)[0]
    return [line.strip() for line in block.splitlines() if line.strip() and not line.strip().startswith("#")]


def test_readme_opens_with_two_commands_and_ci_runs_the_test_one() -> None:
    commands = _readme_commands()
    assert len(commands) == 2
    main_job, tests = commands
    assert "care-retriever quickstart" in main_job and "pytest" in tests
    assert "torch==2.13.0" in main_job and "torch==2.13.0" in tests
    ci = (REPO / ".ci" / "run").read_text("utf-8")
    assert tests in ci.splitlines()


def test_the_command_line_section_shows_the_store_commands_and_the_service() -> None:
    import re

    section = (REPO / "README.md").read_text("utf-8").split("## Command line", 1)[1]
    block = section.split("```bash", 1)[1].split("```", 1)[0]
    shown = set(re.findall(r"^care-retriever ([a-z-]+)", block, flags=re.MULTILINE))
    assert {"init", "index", "search", "info", "delete", "serve"} <= shown, shown
    assert "docs/serving.md" in block and (REPO / "docs" / "serving.md").is_file()


def test_every_command_of_the_cli_is_shown_in_a_readme_command_block() -> None:
    """``care-retriever --help`` lists the commands; each one appears as ``care-retriever NAME`` in a bash block."""
    import re

    from care_retriever.cli.main import command

    commands = set(command().commands)  # every registered command, as --help lists them
    blocks = re.findall(r"```bash\n(.*?)```", (REPO / "README.md").read_text("utf-8"), flags=re.DOTALL)
    shown = {name for block in blocks for name in re.findall(r"care-retriever ([a-z-]+)", block)}
    assert commands - shown == set(), f"commands missing from the README: {sorted(commands - shown)}"
