"""The search service: a FastAPI app over a :class:`CareRetriever` (query tower only).

``POST /search`` takes ``{"query": str | [str, ...], "top_k": int, "filters": {...}, "mode": "dense"}`` and returns
``{"results": [{"query": ..., "hits": [{id, score, text, title, metadata}, ...]}, ...]}``;
``GET /health`` reports the store and the limits; ``GET /metrics`` is in Prometheus text format.
Every limit is explicit (:class:`ServiceLimits`): body size and how long its upload may take,
queries per request, characters per query, ``top_k``, the batch and the queue. Concurrent requests
are micro-batched (:mod:`care_retriever.search.batching`): their queries go through the query tower in one
forward pass, then each request's hits come from its own store search. Bad input is answered with a
4xx and ``{"error": "<one line>"}``; a full queue with 503 and Retry-After; a 5xx means a bug. With
``api_token`` every route wants ``Authorization: Bearer <token>``. ``care-retriever serve``
(:mod:`care_retriever.cli.serve`) runs it under uvicorn, bound to 127.0.0.1 unless told otherwise.
"""

# No ``from __future__ import annotations``: FastAPI reads the /search body type from the live
# annotation of a model class built at runtime with the limits.
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from typing import Annotated, Any, Literal, cast

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, StringConstraints
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from care_retriever.errors import CareError, InputError
from care_retriever.search.batching import Job, Overloaded, QueryBatcher
from care_retriever.search.retriever import CareRetriever

logger = logging.getLogger("care_retriever")
CLIENT_CLOSED = 499  # status recorded in the metrics for a request its client abandoned


@dataclass(frozen=True)
class ServiceLimits:
    """Bounds on what one request may ask for, so no request can exhaust memory or CPU."""

    max_top_k: int = 100
    max_queries: int = 32
    max_query_chars: int = 2048
    max_body_bytes: int = 64 * 1024
    max_concurrency: int = 1  # batches in the query tower at once
    max_batch_size: int = 32  # queries per forward pass (1 = no batching)
    max_wait_ms: float = 5.0  # how long a batch waits for more queries once it has one
    max_queue: int = 256  # queries waiting for a forward pass before 503
    body_timeout_s: float = 10.0  # a request body must arrive within this, else 408

    def __post_init__(self) -> None:
        for name in (
            "max_top_k",
            "max_queries",
            "max_query_chars",
            "max_body_bytes",
            "max_concurrency",
            "max_batch_size",
            "max_queue",
        ):
            if getattr(self, name) < 1:
                raise InputError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_wait_ms < 0 or self.body_timeout_s <= 0:
            raise InputError(
                f"max_wait_ms must be >= 0 and body_timeout_s > 0, got {self.max_wait_ms} and {self.body_timeout_s}"
            )
        if self.max_queue < self.max_queries:
            raise InputError(
                f"max_queue ({self.max_queue}) must be >= max_queries ({self.max_queries}), "
                "else a full request could never be queued"
            )


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
    body = json.dumps({"error": message}).encode()
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


class ServiceMetrics:
    """The service's Prometheus metrics, in a registry of their own (one per app)."""

    ROUTES = ("/search", "/health", "/metrics", "/openapi.json", "/docs")

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self.requests = Counter(
            "care_requests",
            "HTTP requests answered, by route and status code",
            ["route", "status"],
            registry=self.registry,
        )
        self.errors = Counter(
            "care_errors",
            "Requests answered with an error, by kind (client: 4xx but the "
            "kinds named, unauthorized: 401, disconnected: 499, the client left before "
            "sending all its request, overloaded: 503, internal: other 5xx)",
            ["kind"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "care_request_duration_seconds",
            "Time from request to response, by route",
            ["route"],
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0),
        )
        self.batch_size = Histogram(
            "care_batch_queries",
            "Queries per forward pass of the query tower",
            registry=self.registry,
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
        )
        self.batch_seconds = Histogram(
            "care_batch_duration_seconds",
            "Forward pass plus store searches, per batch",
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
        )
        self.queue_wait = Histogram(
            "care_queue_wait_seconds",
            "Time a request waited for its batch to start",
            registry=self.registry,
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
        )
        self.queue_depth = Gauge("care_queue_depth", "Queries waiting for a forward pass", registry=self.registry)
        self.queue_limit = Gauge("care_queue_limit", "Most queries that may wait (beyond: 503)", registry=self.registry)

    def observe_batch(self, queries: int, seconds: float, waits: Sequence[float]) -> None:
        self.batch_size.observe(queries)
        self.batch_seconds.observe(seconds)
        for wait in waits:
            self.queue_wait.observe(wait)

    def observe_request(self, path: str, status: int, seconds: float) -> None:
        route = path if path in self.ROUTES else "other"
        self.requests.labels(route=route, status=str(status)).inc()
        self.latency.labels(route=route).observe(seconds)
        if status >= 400:
            kind = {401: "unauthorized", 503: "overloaded", CLIENT_CLOSED: "disconnected"}.get(
                status, "internal" if status >= 500 else "client"
            )
            self.errors.labels(kind=kind).inc()

    def render(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class RequestMetrics:
    """ASGI middleware (outermost): counts every answer, 401/408/413 from the middlewares included."""

    def __init__(self, app: ASGIApp, metrics: ServiceMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status: int | None = None

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        except BaseException:
            status = status or 500  # uvicorn answers 500 if nothing was sent
            raise
        finally:
            # No answer and no exception: the client left before its request was complete (nginx's 499).
            self.metrics.observe_request(scope.get("path", ""), status or CLIENT_CLOSED, time.perf_counter() - started)


def _one_line(exc: RequestValidationError) -> str:
    """Pydantic's error list as one line: ``body.top_k: Input should be less than or equal to 100``."""
    parts = []
    for err in exc.errors()[:3]:
        where = ".".join(str(p) for p in err.get("loc", ()))
        parts.append(f"{where}: {err.get('msg', 'invalid')}" if where else str(err.get("msg", "invalid")))
    more = len(exc.errors()) - 3
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


class SearchBody(BaseModel):
    """What the /search handler reads of a body; :func:`_request_model`'s class adds the limits' validation."""

    query: str | list[str]


def _request_model(limits: ServiceLimits) -> type[SearchBody]:
    """The /search body, with the limits baked into its validation."""
    query_text = Annotated[StrictStr, StringConstraints(min_length=1, max_length=limits.max_query_chars)]
    scalar = StrictStr | StrictBool | StrictInt | StrictFloat
    filter_value = scalar | Annotated[list[scalar], Field(min_length=1, max_length=256)]

    class SearchRequest(SearchBody):
        model_config = ConfigDict(extra="forbid")

        query: query_text | Annotated[list[query_text], Field(min_length=1, max_length=limits.max_queries)]
        top_k: StrictInt = Field(10, ge=1, le=limits.max_top_k)
        filters: Annotated[dict[str, filter_value], Field(max_length=32)] | None = None
        mode: Literal["dense", "sparse", "hybrid"] = "dense"  # hybrid: the store's BM25 side fused (docs/hybrid.md)

    return SearchRequest


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
) -> ASGIApp:
    """A FastAPI app serving ``retriever`` (a CareRetriever, ideally loaded with the query tower only).

    ``api_token``: when given, every request needs ``Authorization: Bearer <api_token>`` (the schema and the docs
    page included). ``api_docs``: publish the OpenAPI schema at ``/openapi.json`` and its page at ``/docs``.
    """
    limits = limits or ServiceLimits()
    search_request = _request_model(limits)
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
    )

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"error": _one_line(exc)}, status_code=422)

    @app.exception_handler(CareError)
    async def care_error(_: Request, exc: CareError) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=400)

    @app.exception_handler(Overloaded)
    async def overloaded(_: Request, exc: Overloaded) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=503, headers={"Retry-After": str(exc.retry_after)})

    @app.exception_handler(RecursionError)
    async def too_deep(_: Request, exc: RecursionError) -> JSONResponse:  # a JSON body nested thousands deep
        return JSONResponse({"error": "request body is nested too deeply"}, status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers)

    @app.get("/health")
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
        }

    @app.get("/metrics")
    async def prometheus() -> Response:
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)

    @app.post("/search")
    async def search(request: search_request) -> dict[str, Any]:  # type: ignore[valid-type]  # built per limits
        request = cast(SearchBody, request)
        queries = [request.query] if isinstance(request.query, str) else list(request.query)
        for i, q in enumerate(queries):  # refused here, so a blank query never joins (and fails) a batch
            if not q.strip():
                raise InputError(f"query {i}: empty query" if len(queries) > 1 else "empty query")
        params = request.model_dump(exclude={"query"})  # top_k, filters, ...: the job's search parameters
        hits = await batcher.submit(queries, params)
        return {
            "results": [{"query": q, "hits": [h.to_dict() for h in row]} for q, row in zip(queries, hits, strict=True)]
        }

    guarded: ASGIApp = BodyLimit(app, limits.max_body_bytes, limits.body_timeout_s)
    if api_token:
        guarded = BearerAuth(guarded, api_token)
    return RequestMetrics(guarded, metrics)
