"""The search service's Prometheus metrics (``GET /metrics``): :class:`ServiceMetrics`, a registry of its own per
app, and :class:`RequestMetrics`, the outermost ASGI middleware, which counts every answer (those of the body-limit
and token middlewares included). The batches' figures come from :mod:`care_retriever.search.batching`; the app is
:mod:`care_retriever.search.server`, which wires both in.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from starlette.types import ASGIApp, Message, Receive, Scope, Send

CLIENT_CLOSED = 499  # status recorded in the metrics for a request its client abandoned


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
