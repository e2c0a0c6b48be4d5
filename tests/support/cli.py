"""Commands the tests run: ``care-retriever`` in process (its output read from pytest's capture), torchrun."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def run_cli(capsys, *args: object) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of one ``care-retriever`` call."""
    from care_retriever.cli.main import main

    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def one_line(err: str) -> str:
    """The one line a refused command printed, after checking it printed one line and no traceback."""
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def torchrun() -> list[str]:
    """The command that starts ``torchrun`` of this interpreter's environment."""
    exe = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which("torchrun")
    return [exe] if exe else [sys.executable, "-m", "torch.distributed.run"]
