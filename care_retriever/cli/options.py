"""Options several commands share, defined once."""

from __future__ import annotations

from typing import Annotated

import typer

TRUST_REMOTE_CODE_HELP = (
    "Run model code shipped with a tower (auto_map). Off by default; a model whose tower needs it needs it at every "
    "load."
)
TrustRemoteCode = Annotated[bool, typer.Option("--trust-remote-code", help=TRUST_REMOTE_CODE_HELP)]
