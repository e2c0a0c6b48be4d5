"""``care-retriever serve``: the HTTP search service (FastAPI + uvicorn), query tower only.

Binds to 127.0.0.1 by default: the service has no authentication, so exposing it is an explicit
choice (``--host 0.0.0.0`` behind a proxy that authenticates). ``--port 0`` picks a free port; the
address actually bound is printed on stderr before serving (tests and scripts read it).
"""

from __future__ import annotations

import ipaddress
import socket
import sys
from typing import Annotated

import typer

from care_retriever.errors import InputError

DEFAULT_HOST = "127.0.0.1"


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind ``host:port`` ourselves so the real port of ``--port 0`` is known before uvicorn starts."""
    if not 0 <= port <= 65535:
        raise InputError(f"--port must be in 0..65535, got {port}")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise InputError(f"cannot bind {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


def serve(
    model: Annotated[str, typer.Option(help="CARE model folder or hub id (only its query tower is loaded).")],
    store: Annotated[str, typer.Option(help="faiss:DIR | qdrant:PATH | qdrant:http://host:6333")],
    collection: Annotated[str | None, typer.Option(help="Qdrant collection name.")] = None,
    host: Annotated[str, typer.Option(help="Address to bind (loopback by default: the API has no auth).")] = (
        DEFAULT_HOST
    ),
    port: Annotated[int, typer.Option(help="Port (0 = any free port; the bound address is printed).")] = 8000,
    max_top_k: Annotated[int, typer.Option(help="Largest top_k a request may ask for.")] = 100,
    max_queries: Annotated[int, typer.Option(help="Most queries in one request.")] = 32,
    max_query_chars: Annotated[int, typer.Option(help="Longest query, in characters.")] = 2048,
    max_body_bytes: Annotated[int, typer.Option(help="Largest request body, in bytes.")] = 64 * 1024,
    max_concurrency: Annotated[int, typer.Option(help="Searches run at once (others wait).")] = 4,
    max_connections: Annotated[int, typer.Option(help="Open connections before answering 503.")] = 256,
    instruction: Annotated[str | None, typer.Option(help="Override the query instruction.")] = None,
    device: Annotated[str | None, typer.Option(help="cpu | cuda (default: auto).")] = None,
    backend: Annotated[
        str, typer.Option(help="auto | torch | onnx (auto: the model's export if it has one; see `export`).")
    ] = "auto",
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "warning",
) -> None:
    """Serve /search and /health over HTTP with the query tower and a store."""
    for name, value in (("--max-top-k", max_top_k), ("--max-queries", max_queries),
                        ("--max-query-chars", max_query_chars), ("--max-body-bytes", max_body_bytes),
                        ("--max-concurrency", max_concurrency), ("--max-connections", max_connections)):
        if value < 1:
            raise InputError(f"{name} must be >= 1, got {value}")
    import uvicorn

    from care_retriever.backends import resolve_backend
    from care_retriever.cli.core import quiet_transformers
    from care_retriever.retriever import CareRetriever
    from care_retriever.server import ServiceLimits, create_app

    if resolve_backend(model, backend) == "torch":
        quiet_transformers()
    retriever = CareRetriever.from_pretrained(model, store, collection=collection, device=device,
                                              backend=backend, instruction=instruction)
    limits = ServiceLimits(max_top_k=max_top_k, max_queries=max_queries, max_query_chars=max_query_chars,
                           max_body_bytes=max_body_bytes, max_concurrency=max_concurrency)
    app = create_app(retriever, limits, model_name=model)
    sock = bind_socket(host, port)
    bound_host, bound_port = sock.getsockname()[:2]
    if not _is_loopback(host):
        typer.secho(f"warning: binding to {host}: the service has no authentication; put it behind a proxy "
                    "that authenticates", err=True, fg="yellow")
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    typer.echo(f"care-retriever serve: listening on http://{shown}:{bound_port} "
               f"({retriever.store.count()} documents, {retriever.store.describe()})", err=True)
    sys.stderr.flush()
    config = uvicorn.Config(app, log_level=log_level, access_log=False, server_header=False,
                            limit_concurrency=max_connections, timeout_keep_alive=5,
                            h11_max_incomplete_event_size=16 * 1024)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
        retriever.close()


def register(app: typer.Typer) -> None:
    app.command()(serve)
