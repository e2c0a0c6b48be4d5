"""The ``care-retriever`` command called in process, its output read from pytest's capture."""

from __future__ import annotations


def run_cli(capsys, *args: object) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of one ``care-retriever`` call."""
    from care_retriever.cli.main import main

    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err
