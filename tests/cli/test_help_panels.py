"""Every command's ``--help`` opens with a short panel of what most runs need; the rest sits in named panels."""

from __future__ import annotations

import re

import pytest

from care_retriever.cli.main import command, main
from care_retriever.cli.panels import ADVANCED, COMMON, SHORT, command_options, panels_of


def _commands(group=None, prefix: str = ""):
    group = group or command()
    for name, sub in group.commands.items():
        if getattr(sub, "commands", None):
            yield from _commands(sub, f"{prefix}{name} ")
        else:
            yield f"{prefix}{name}", sub


ALL = dict(_commands())


@pytest.mark.parametrize("name", sorted(ALL))
def test_first_panel_is_short_and_holds_every_required_option(name: str) -> None:
    panels = panels_of(ALL[name])
    assert len(panels[COMMON]) <= SHORT, panels[COMMON]
    required = [o.opts[0] for o in command_options(ALL[name]) if o.required]
    assert set(required) <= set(panels[COMMON])
    if ADVANCED in panels:  # "Advanced" is listed last
        assert list(panels)[-1] == ADVANCED


@pytest.mark.parametrize(
    ("name", "first"),
    [
        ("index", {"--model", "--corpus", "--store", "--json"}),
        ("search", {"--model", "--store", "--top-k", "--json", "--backend"}),
        ("serve", {"--model", "--store", "--port"}),
        ("eval", {"--model", "--task", "--json"}),
        ("init", {"--preset"}),
    ],
)
def test_the_options_a_first_run_needs_come_first(name: str, first: set[str]) -> None:
    assert first <= set(panels_of(ALL[name])[COMMON])


def test_index_help_as_a_user_reads_it(capsys) -> None:
    assert main(["index", "--help"]) == 0
    out = capsys.readouterr().out
    titles = re.findall(r"╭─ ([A-Za-z ]+?) ─", out)
    assert titles == ["Options", "Corpus", "Encoding", "Store index", "Advanced"]
    options = out[: out.index("╭─ Corpus")]
    assert "--model" in options and "--dtype" not in options and "--dtype" in out
