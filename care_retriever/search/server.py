"""The search service: a FastAPI app over a :class:`CareRetriever` (query tower only).

``POST /search`` takes ``{"query": str | [str, ...], "top_k": int, "filters": {...}, "mode": "dense"}`` and returns
``{"results": [{"query": ..., "hits": [{id, score, text, title, metadata}, ...]}, ...], "query_backend": ...}``;
``GET /health`` reports the store and the limits; ``GET /metrics`` is in Prometheus text format
(:mod:`care_retriever.search.service_metrics`).
Every limit is explicit (:class:`ServiceLimits`): body size and how long its upload may take,
queries per request, characters per query, ``top_k``, the batch and the queue. Concurrent requests
are micro-batched (:mod:`care_retriever.search.batching`): their queries go through the query tower in one
forward pass, then each request's hits come from its own store search. Every error is answered with
``{"error": "<one line>"}`` (:class:`ErrorBody`, declared in ``/openapi.json`` for each status a route returns,
:data:`ERROR_STATUSES`): 400 a body that is not JSON, 422 JSON the schema refuses (naming the field), 413 and 408
the body's size and time limits, 401 the token, 503 a full queue (with Retry-After), 500 a bug or a store that
cannot answer. With ``api_token`` every route wants ``Authorization: Bearer <token>``. ``care-retriever serve``
(:mod:`care_retriever.cli.serve`) runs it under uvicorn, bound to 127.0.0.1 unless told otherwise; docs/serving.md
is the user's guide.
"""

# No ``from __future__ import annotations``: FastAPI reads the /search body type from the live
# annotation of a model class built at runtime with the limits.
import hmac
import json
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict
from typing import Any, cast

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from care_retriever import strict_json
from care_retriever.errors import CareError, InputError
from care_retriever.search.batching import Job, Overloaded, QueryBatcher
from care_retriever.search.retriever import CareRetriever
from care_retriever.search.service_metrics import RequestMetrics, ServiceMetrics
from care_retriever.search.service_schema import (
    EVERY_ROUTE,
    ErrorBody,
    HealthReport,
    SearchBody,
    SearchResponse,
    ServiceLimits,
    StrictJSONResponse,
    error_response,
    error_responses,
    request_model,
    validation_answer,
)

__all__ = ["ServiceLimits", "create_app", "search_batch"]  # ServiceLimits: where the service's callers import it

logger = logging.getLogger("care_retriever")


class BodyLimit:
    """ASGI middleware: read at most ``max_bytes`` of request body, else answer 413 without calling the app.

    The body is buffered here (it is small by construction) and replayed to the app, so a client that
    streams a chunked body with no Content-Length is cut off as soon as it crosses the limit, and one
    that dribbles it (or stops half way) gets 408 after ``timeout_s`` instead of holding a slot forever.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float = 10.0) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

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
        with anyio.move_on_after(self.timeout_s) as deadline:
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
        if deadline.cancelled_caught:
            await _send_error(send, 408, f"request body not received within {self.timeout_s:g} s")
            return
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


async def _send_error(send: Send, status: int, message: str, headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    body = strict_json.dumps(ErrorBody(error=message).model_dump(), compact=True).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers],
        }
    )
    await send({"type": "http.response.body", "body": body})


class BearerAuth:
    """ASGI middleware: every request must carry ``Authorization: Bearer <token>``, else 401.

    Checked before the body is read, so an unauthenticated client costs no buffering. The comparison
    takes the same time wherever the first wrong byte is; the token is never logged nor echoed.
    """

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(given, self._expected):
                await _send_error(
                    send,
                    401,
                    "missing or invalid bearer token (Authorization: Bearer <token>)",
                    [(b"www-authenticate", b'Bearer realm="care-retriever"')],
                )
                return
        await self.app(scope, receive, send)

    def __repr__(self) -> str:
        return "BearerAuth(token=<hidden>)"


def search_batch(retriever: CareRetriever, jobs: Sequence[Job]) -> list[Any]:
    """Answer a batch of jobs: one forward pass for all their queries, one store search per parameter set.

    Returns, for each job in order, its hits (one list per query) or the error that concerns it alone:
    a job whose queries the tower refuses is answered on its own, so it cannot fail its neighbours.
    """
    texts = [q for job in jobs for q in job.queries]
    try:
        vectors = retriever.embed_queries(texts)
    except CareError as exc:
        if len(jobs) == 1:
            return [exc]
        return [result for job in jobs for result in search_batch(retriever, [job])]
    starts = [0]
    for job in jobs:
        starts.append(starts[-1] + len(job.queries))
    groups: dict[str, list[int]] = {}  # jobs searched with the same parameters share one store search
    for i, job in enumerate(jobs):
        groups.setdefault(json.dumps(job.params, sort_keys=True, default=str), []).append(i)
    results: list[Any] = [None] * len(jobs)
    for members in groups.values():
        rows = [row for i in members for row in range(starts[i], starts[i + 1])]
        try:
            hits = retriever.search_vectors(vectors[rows], queries=[texts[r] for r in rows], **jobs[members[0]].params)
        except CareError as exc:
            for i in members:
                results[i] = exc
            continue
        at = 0
        for i in members:
            results[i] = hits[at : at + len(jobs[i].queries)]
            at += len(jobs[i].queries)
    return results


def create_app(
    retriever: CareRetriever,
    limits: ServiceLimits | None = None,
    *,
    model_name: str = "",
    api_token: str | None = None,
    api_docs: bool = True,
    query_compile: str = "off",
) -> ASGIApp:
    """A FastAPI app serving ``retriever`` (a CareRetriever, ideally loaded with the query tower only).

    ``api_token``: when given, every request needs ``Authorization: Bearer <api_token>`` (the schema and the docs
    page included). ``api_docs``: publish the OpenAPI schema at ``/openapi.json`` and its page at ``/docs``.
    ``query_compile``: whether the query tower was compiled (``serve --compile``), as ``/health`` reports it.
    """
    from care_retriever.search.backends import query_backend

    limits = limits or ServiceLimits()
    backend = query_backend(retriever.embedder)  # said in every answer: an export scores slightly otherwise
    search_request = request_model(limits, retriever.store)
    metrics = ServiceMetrics()
    batcher = QueryBatcher(
        lambda jobs: search_batch(retriever, jobs),
        max_batch_size=limits.max_batch_size,
        max_wait_s=limits.max_wait_ms / 1000,
        max_queue=limits.max_queue,
        workers=limits.max_concurrency,
        observe=metrics.observe_batch,
    )
    metrics.queue_depth.set_function(lambda: batcher.depth)
    metrics.queue_limit.set(limits.max_queue)
    health_limiter = anyio.CapacityLimiter(1)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await batcher.aclose()  # uvicorn has let the in-flight requests finish by now

    app = FastAPI(
        title="care-retriever",
        summary="CARE dense retrieval: query tower + vector store",
        # The request format, published: the schema and an interactive page (behind the token when one is set).
        docs_url="/docs" if api_docs else None,
        redoc_url=None,
        openapi_url="/openapi.json" if api_docs else None,
        lifespan=lifespan,
        default_response_class=StrictJSONResponse,
    )
    # the statuses every route may answer (the middlewares' and a bug's); 401 only where a token is set
    every_route = [status for status in EVERY_ROUTE if status != 401 or api_token]

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(*validation_answer(exc))

    @app.exception_handler(CareError)
    async def care_error(_: Request, exc: CareError) -> JSONResponse:
        # a value of the request the store or the tower refused; any other CareError: a store that cannot answer
        return error_response(422 if isinstance(exc, InputError) else 500, str(exc))

    @app.exception_handler(Overloaded)
    async def overloaded(_: Request, exc: Overloaded) -> JSONResponse:
        return error_response(503, str(exc), headers={"Retry-After": str(exc.retry_after)})

    @app.exception_handler(RecursionError)
    async def too_deep(_: Request, exc: RecursionError) -> JSONResponse:  # a JSON body nested thousands deep
        return error_response(400, "request body is nested too deeply")

    @app.exception_handler(StarletteHTTPException)
    async def httperror_response(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        # FastAPI answers a body it could not parse with a bare "There was an error parsing the body": say why
        cause = exc.__cause__
        message = str(exc.detail)
        if isinstance(cause, UnicodeDecodeError):
            message = f"request body is not valid UTF-8 (byte {cause.start})"
        elif isinstance(cause, RecursionError):
            message = "request body is nested too deeply"
        return error_response(exc.status_code, message, headers=exc.headers)

    @app.exception_handler(Exception)
    async def bug(_: Request, exc: Exception) -> JSONResponse:  # logged by the server as well (it is re-raised)
        return error_response(500, f"internal error ({type(exc).__name__}); the service's log has the details")

    @app.get("/health", response_model=HealthReport, responses=error_responses(every_route))
    async def health() -> dict[str, Any]:
        store = retriever.store
        count = await anyio.to_thread.run_sync(store.count, limiter=health_limiter)
        towers = list(retriever.embedder.loaded_towers)
        return {
            "status": "ok",
            "store": store.describe(),
            "documents": count,
            "dim": retriever.embedder.dim,
            # what the scores are (the store's model: cosine, or the dot product of the authors' released models)
            "similarity": store.manifest.metric if store.manifest is not None else None,
            "model": model_name,
            "towers": towers,
            "limits": asdict(limits),
            "queue_depth": batcher.depth,
            "query_compile": query_compile,
            "query_backend": backend,
        }

    @app.get("/metrics", response_class=PlainTextResponse, responses=error_responses(every_route, json_route=False))
    async def prometheus() -> Response:
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)

    @app.post("/search", response_model=SearchResponse, responses=error_responses([*every_route, 422, 503]))
    async def search(request: search_request) -> dict[str, Any]:  # type: ignore[valid-type]  # built per limits
        request = cast(SearchBody, request)
        queries = [request.query] if isinstance(request.query, str) else list(request.query)
        params = request.model_dump(exclude={"query"})  # top_k, filters, ...: the job's search parameters
        hits = await batcher.submit(queries, params)
        return {
            "results": [{"query": q, "hits": [h.to_dict() for h in row]} for q, row in zip(queries, hits, strict=True)],
            "query_backend": backend,
        }

    guarded: ASGIApp = BodyLimit(app, limits.max_body_bytes, limits.body_timeout_s)
    if api_token:
        guarded = BearerAuth(guarded, api_token)
    return RequestMetrics(guarded, metrics)
