"""The search service: a FastAPI app over a :class:`CareRetriever` (query tower only).

``POST /search`` takes ``{"query": str | [str, ...], "top_k": int, "filters": {...}, "mode": "dense"}`` and returns
``{"results": [{"query": ..., "hits": [{id, score, text, title, metadata}, ...]}, ...]}``;
``GET /health`` reports the store and the limits. Every limit is explicit (:class:`ServiceLimits`):
body size, queries per request, characters per query, ``top_k``, concurrent searches. Bad input is
answered with a 4xx and ``{"error": "<one line>"}``; a 5xx means a bug. ``care-retriever serve``
(:mod:`care_retriever.cli.serve`) runs it under uvicorn, bound to 127.0.0.1 unless told otherwise.
"""

# No ``from __future__ import annotations``: FastAPI reads the /search body type from the live
# annotation of a model class built at runtime with the limits.
import json
import logging
from dataclasses import asdict, dataclass
from functools import partial
from typing import Annotated, Any, Literal

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, StringConstraints
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from care_retriever.errors import CareError

logger = logging.getLogger("care_retriever")


@dataclass(frozen=True)
class ServiceLimits:
    """Bounds on what one request may ask for, so no request can exhaust memory or CPU."""

    max_top_k: int = 100
    max_queries: int = 32
    max_query_chars: int = 2048
    max_body_bytes: int = 64 * 1024
    max_concurrency: int = 4


class BodyLimit:
    """ASGI middleware: read at most ``max_bytes`` of request body, else answer 413 without calling the app.

    The body is buffered here (it is small by construction) and replayed to the app, so a client that
    streams a chunked body with no Content-Length is cut off as soon as it crosses the limit.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                await _send_error(send, 400, "invalid Content-Length header")
                return
            if size > self.max_bytes:
                await _send_error(send, 413, f"request body of {size} bytes exceeds the limit of {self.max_bytes}")
                return
        chunks: list[bytes] = []
        received = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                await _send_error(send, 413, f"request body exceeds the limit of {self.max_bytes} bytes")
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


async def _send_error(send: Send, status: int, message: str) -> None:
    body = json.dumps({"error": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def _one_line(exc: RequestValidationError) -> str:
    """Pydantic's error list as one line: ``body.top_k: Input should be less than or equal to 100``."""
    parts = []
    for err in exc.errors()[:3]:
        where = ".".join(str(p) for p in err.get("loc", ()))
        parts.append(f"{where}: {err.get('msg', 'invalid')}" if where else str(err.get("msg", "invalid")))
    more = len(exc.errors()) - 3
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def _request_model(limits: ServiceLimits) -> type[BaseModel]:
    """The /search body, with the limits baked into its validation."""
    query_text = Annotated[StrictStr, StringConstraints(min_length=1, max_length=limits.max_query_chars)]
    scalar = StrictStr | StrictBool | StrictInt | StrictFloat
    filter_value = scalar | Annotated[list[scalar], Field(min_length=1, max_length=256)]

    class SearchRequest(BaseModel):
        model_config = ConfigDict(extra="forbid")

        query: query_text | Annotated[list[query_text], Field(min_length=1, max_length=limits.max_queries)]
        top_k: StrictInt = Field(10, ge=1, le=limits.max_top_k)
        filters: Annotated[dict[str, filter_value], Field(max_length=32)] | None = None
        mode: Literal["dense", "sparse", "hybrid"] = "dense"  # hybrid: the store's BM25 side fused (docs/hybrid.md)

    return SearchRequest


def create_app(retriever: Any, limits: ServiceLimits | None = None, *, model_name: str = "") -> ASGIApp:
    """A FastAPI app serving ``retriever`` (a CareRetriever, ideally loaded with the query tower only)."""
    limits = limits or ServiceLimits()
    search_request = _request_model(limits)
    limiter = anyio.CapacityLimiter(limits.max_concurrency)
    app = FastAPI(title="care-retriever", summary="CARE dense retrieval: query tower + vector store",
                  docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"error": _one_line(exc)}, status_code=422)

    @app.exception_handler(CareError)
    async def care_error(_: Request, exc: CareError) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=400)

    @app.exception_handler(RecursionError)
    async def too_deep(_: Request, exc: RecursionError) -> JSONResponse:  # a JSON body nested thousands deep
        return JSONResponse({"error": "request body is nested too deeply"}, status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        store = retriever.store
        count = await anyio.to_thread.run_sync(store.count, limiter=limiter)
        towers = [t for t in ("query", "document") if getattr(retriever.embedder, f"_{t}_model", None) is not None]
        return {"status": "ok", "store": store.describe(), "documents": count, "dim": retriever.embedder.dim,
                "model": model_name, "towers": towers, "limits": asdict(limits)}

    @app.post("/search")
    async def search(request: search_request) -> dict[str, Any]:  # type: ignore[valid-type]
        queries = [request.query] if isinstance(request.query, str) else list(request.query)
        call = partial(retriever.search, queries, top_k=request.top_k, filters=request.filters, mode=request.mode)
        hits = await anyio.to_thread.run_sync(call, limiter=limiter)
        return {"results": [{"query": q, "hits": [h.to_dict() for h in row]}
                            for q, row in zip(queries, hits, strict=True)]}

    return BodyLimit(app, limits.max_body_bytes)
