"""Options several commands share, defined once."""

from __future__ import annotations

from typing import Annotated

import typer

from care_retriever.model.towers.loading import TRUST_REMOTE_CODE_HELP

TrustRemoteCode = Annotated[bool, typer.Option("--trust-remote-code", help=TRUST_REMOTE_CODE_HELP)]
