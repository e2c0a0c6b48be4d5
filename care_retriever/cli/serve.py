"""``care-retriever serve``: the HTTP search service (FastAPI + uvicorn), query tower only.

Binds to 127.0.0.1 by default: exposing the service is an explicit choice (``--host 0.0.0.0``),
best with a bearer token (the variable named by ``--token-env``, ``CARE_API_TOKEN`` by default: when it
is set, every request needs ``Authorization: Bearer <token>``) or behind a proxy that authenticates.
``--port 0`` picks a free port; the address actually bound is printed on stderr before serving (tests
and scripts read it). SIGTERM or Ctrl-C: stop accepting, finish the requests in flight (at most
``--shutdown-timeout`` seconds), exit.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
from typing import Annotated

import typer

from care_retriever.cli.options import TrustRemoteCode
from care_retriever.cli.panels import COMMON, LIMITS
from care_retriever.errors import InputError

DEFAULT_HOST = "127.0.0.1"
TOKEN_ENV = "CARE_API_TOKEN"


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
    # proto IPPROTO_TCP, not 0: asyncio turns Nagle off (TCP_NODELAY) only on sockets that say they are
    # TCP; without it every keep-alive request after the first waits on Nagle x delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise InputError(f"cannot bind {host}:{port}: {exc.strerror or exc}") from exc
    sock.set_inheritable(True)
    return sock


def serve(
    model: Annotated[
        str, typer.Option(help="CARE model folder or hub id (only its query tower is loaded).", rich_help_panel=COMMON)
    ],
    store: Annotated[
        str, typer.Option(help="faiss:DIR | qdrant:PATH | qdrant:http://host:6333", rich_help_panel=COMMON)
    ],
    collection: Annotated[str | None, typer.Option(help="Qdrant collection name.", rich_help_panel=COMMON)] = None,
    host: Annotated[str, typer.Option(help="Address to bind (loopback by default).", rich_help_panel=COMMON)] = (
        DEFAULT_HOST
    ),
    port: Annotated[
        int, typer.Option(help="Port (0 = any free port; the bound address is printed).", rich_help_panel=COMMON)
    ] = 8000,
    max_top_k: Annotated[int, typer.Option(help="Largest top_k a request may ask for.", rich_help_panel=LIMITS)] = 100,
    max_queries: Annotated[int, typer.Option(help="Most queries in one request.", rich_help_panel=LIMITS)] = 32,
    max_query_chars: Annotated[int, typer.Option(help="Longest query, in characters.", rich_help_panel=LIMITS)] = 2048,
    max_body_bytes: Annotated[int, typer.Option(help="Largest request body, in bytes.", rich_help_panel=LIMITS)] = 64
    * 1024,
    max_concurrency: Annotated[
        int, typer.Option(help="Batches in the query tower at once (others wait).", rich_help_panel=LIMITS)
    ] = 1,
    max_batch_size: Annotated[
        int, typer.Option(help="Most queries per forward pass (1 = no batching).", rich_help_panel=LIMITS)
    ] = 32,
    max_wait_ms: Annotated[
        float, typer.Option(help="How long a batch waits for more queries (ms).", rich_help_panel=LIMITS)
    ] = 5.0,
    max_queue: Annotated[
        int, typer.Option(help="Queries waiting for the tower before answering 503.", rich_help_panel=LIMITS)
    ] = 256,
    body_timeout: Annotated[
        float, typer.Option(help="Seconds a request body may take to arrive (else 408).", rich_help_panel=LIMITS)
    ] = (10.0),
    max_connections: Annotated[
        int, typer.Option(help="Open connections before answering 503.", rich_help_panel=LIMITS)
    ] = 256,
    shutdown_timeout: Annotated[
        float, typer.Option(help="On SIGTERM, seconds to let requests in flight finish.", rich_help_panel=LIMITS)
    ] = (30.0),
    token_env: Annotated[
        str,
        typer.Option(help="Environment variable holding the bearer token (auth on if set).", rich_help_panel=COMMON),
    ] = (TOKEN_ENV),
    instruction: Annotated[str | None, typer.Option(help="Override the query instruction.")] = None,
    device: Annotated[str | None, typer.Option(help="cpu | cuda (default: auto).", rich_help_panel=COMMON)] = None,
    backend: Annotated[
        str,
        typer.Option(
            help="auto | torch | onnx | openvino (auto: the model's export if it has one; see `export`).",
            rich_help_panel=COMMON,
        ),
    ] = "auto",
    threads: Annotated[
        int | None, typer.Option(help="CPU threads per forward pass (default: the cores / --max-concurrency).")
    ] = None,
    compile: Annotated[
        bool,
        typer.Option(
            "--compile",
            help="torch backend: compile the query tower at start (seconds to a minute; faster queries after).",
        ),
    ] = False,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "warning",
    api_docs: Annotated[
        bool, typer.Option(help="Publish the OpenAPI schema at /openapi.json and its page at /docs.")
    ] = True,
    trust_remote_code: TrustRemoteCode = False,
) -> None:
    """Serve /search, /health and /metrics over HTTP with the query tower and a store (schema: /openapi.json, /docs)."""
    if threads is not None and threads < 1:
        raise InputError(f"--threads must be >= 1, got {threads}")
    for name, value in (
        ("--max-top-k", max_top_k),
        ("--max-queries", max_queries),
        ("--max-query-chars", max_query_chars),
        ("--max-body-bytes", max_body_bytes),
        ("--max-concurrency", max_concurrency),
        ("--max-connections", max_connections),
        ("--max-batch-size", max_batch_size),
        ("--max-queue", max_queue),
    ):
        if value < 1:
            raise InputError(f"{name} must be >= 1, got {value}")
    for name, seconds in (("--max-wait-ms", max_wait_ms), ("--shutdown-timeout", shutdown_timeout)):
        if not seconds >= 0:
            raise InputError(f"{name} must be >= 0, got {seconds}")
    if not body_timeout > 0:
        raise InputError(f"--body-timeout must be > 0, got {body_timeout}")
    if max_queue < max_queries:
        raise InputError(f"--max-queue ({max_queue}) must be >= --max-queries ({max_queries})")
    api_token = os.environ.get(token_env)
    if api_token is not None and not api_token.strip():
        raise InputError(f"${token_env} is set but empty: set a token, or unset it to serve without auth")
    import uvicorn

    from care_retriever.model.towers.loading import quiet_transformers
    from care_retriever.search.backends import query_backend, resolve_backend
    from care_retriever.search.http_protocol import ErrorBodyH11Protocol
    from care_retriever.search.retriever import CareRetriever
    from care_retriever.search.server import ServiceLimits, create_app

    if resolve_backend(model, backend) == "torch":
        quiet_transformers()
    # Forward passes run --max-concurrency at a time: more threads than cores between them only
    # makes them take turns (ONNX Runtime's pool threads spin while they wait).
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    threads = threads or max(1, cores // max_concurrency)
    retriever = CareRetriever.from_pretrained(
        model,
        store,
        collection=collection,
        device=device,
        backend=backend,
        instruction=instruction,
        threads=threads,
        trust_remote_code=trust_remote_code,
        compile=compile,
    )
    query_compile = "off"
    if compile:  # the torch backend (load_query_embedder refuses the others): torch is imported already
        from care_retriever.runtime.compiled import query_compile_state

        query_compile = query_compile_state(getattr(retriever.embedder, "query_model", None))
    limits = ServiceLimits(
        max_top_k=max_top_k,
        max_queries=max_queries,
        max_query_chars=max_query_chars,
        max_body_bytes=max_body_bytes,
        max_concurrency=max_concurrency,
        max_batch_size=max_batch_size,
        max_wait_ms=max_wait_ms,
        max_queue=max_queue,
        body_timeout_s=body_timeout,
    )
    app = create_app(
        retriever, limits, model_name=model, api_token=api_token, api_docs=api_docs, query_compile=query_compile
    )
    sock = bind_socket(host, port)
    bound_host, bound_port = sock.getsockname()[:2]
    if not _is_loopback(host) and not api_token:
        typer.secho(
            f"warning: binding to {host} without authentication: set ${token_env} or put the service "
            "behind a proxy that authenticates",
            err=True,
            fg="yellow",
        )
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    batching = f"batches of up to {max_batch_size}" if max_batch_size > 1 else "no batching"
    typer.echo(
        f"care-retriever serve: listening on http://{shown}:{bound_port} "
        f"({retriever.store.count()} documents, {retriever.store.describe()}; {batching}; "
        f"auth {'on' if api_token else 'off'}; query backend {query_backend(retriever.embedder)}"
        f"{'; query tower compile ' + query_compile if compile else ''})",
        err=True,
    )
    sys.stderr.flush()
    config = uvicorn.Config(
        app,
        log_level=log_level,
        access_log=False,
        server_header=False,
        limit_concurrency=max_connections,
        http=ErrorBodyH11Protocol,  # a request that is not valid HTTP gets the service's JSON error body too
        timeout_keep_alive=5,
        h11_max_incomplete_event_size=16 * 1024,
        # uvicorn types it int, and waits on it with asyncio.wait_for, which takes seconds as a float
        timeout_graceful_shutdown=shutdown_timeout,  # type: ignore[arg-type]
    )
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
        retriever.close()


def register(app: typer.Typer) -> None:
    app.command()(serve)
