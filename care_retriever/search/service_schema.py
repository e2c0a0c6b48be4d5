"""The search service's contract, as ``/openapi.json`` publishes it: the limits (:class:`ServiceLimits`), the
request (:func:`request_model`, with the limits in its validation and its schema), the responses, and the one error
body (:class:`ErrorBody`) with each status it comes with (:data:`ERROR_STATUSES`); the one line a refused body gets
(:func:`validation_answer`); the JSON every body is written as (:class:`StrictJSONResponse`).

docs/serving.md is the user's guide; :mod:`care_retriever.search.server` serves it.
"""

# No ``from __future__ import annotations``: pydantic reads the fields' live annotations, and the request class is
# built at runtime with the limits.
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    StringConstraints,
    field_validator,
)
from pydantic_core import PydanticCustomError

from care_retriever import strict_json
from care_retriever.errors import CareError, InputError
from care_retriever.search.hybrid import sparse_store
from care_retriever.stores.base import VectorStore
from care_retriever.stores.filters import validate_filters


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


class ErrorBody(BaseModel):
    """Every error the service answers, whatever its status: one line saying what was wrong (and which field)."""

    model_config = ConfigDict(extra="forbid")

    error: str = Field(examples=["top_k: Input should be less than or equal to 100"])


# Each status the service answers with an ErrorBody, and when: the schema declares these for its routes (the
# middlewares' statuses for every route, 422 and 503 for /search), docs/reference/http-service.md tabulates them.
ERROR_STATUSES: dict[int, str] = {
    400: "The body is not JSON: empty, malformed (the line and column), not UTF-8, nested too deeply; or a "
    "Content-Length header that is not a number.",
    401: "Missing or wrong bearer token (only when the service runs with a token).",
    408: "The body did not arrive within the time limit.",
    413: "The body is larger than the limit.",
    422: "JSON the schema refuses, naming the field: not an object, a missing or unknown field, a wrong type, a "
    "value out of range, an empty or blank query, an empty or too long list of queries, a filter the store cannot "
    "match, a mode the store cannot search.",
    500: "A bug, or a store that cannot answer (the line says which); the service's log has the details.",
    503: "The queue is full: try again after the Retry-After header's seconds.",
}
EVERY_ROUTE = (400, 401, 408, 413, 500)  # the middlewares' answers (401 only with a token) and a bug


def error_responses(statuses: Sequence[int], json_route: bool = True) -> dict[int | str, dict[str, Any]]:
    """The schema's declaration of each status in ``statuses``: an :class:`ErrorBody` in JSON. ``json_route=False``
    for a route answering another media type (/metrics: text), where FastAPI would declare a ``model`` in that type:
    the JSON body is named there by reference (the JSON routes put :class:`ErrorBody` in the components)."""
    body = {"application/json": {"schema": {"$ref": f"#/components/schemas/{ErrorBody.__name__}"}}}
    model = {"model": ErrorBody} if json_route else {}
    return {status: {"description": ERROR_STATUSES[status], "content": body, **model} for status in sorted(statuses)}


class SearchHit(BaseModel):
    id: str
    score: float = Field(description="The model's similarity (cosine or dot, /health's similarity); fused in hybrid")
    text: str
    title: str
    metadata: dict[str, Any]


class QueryHits(BaseModel):
    query: str
    hits: list[SearchHit]


class SearchResponse(BaseModel):
    """One entry per query, in the request's order, and the query backend that encoded them."""

    results: list[QueryHits]
    query_backend: str = Field(
        description="torch | onnx | onnx-int8 | openvino | openvino-int8: the query tower that answered"
    )


class HealthReport(BaseModel):
    status: Literal["ok"]
    store: str
    documents: int
    dim: int
    similarity: Literal["cosine", "dot"] | None
    model: str
    towers: list[str]
    limits: ServiceLimits
    queue_depth: int
    # the query tower compiled (serve --compile): "on (N s)", "off (failed: ...)", or "off"
    query_compile: str = "off"
    query_backend: str = "torch"  # torch | onnx | onnx-int8 | openvino | openvino-int8


class SearchBody(BaseModel):
    """What the /search handler reads of a body; :func:`_request_model`'s class adds the limits' validation."""

    query: str | list[str]


def _json_kind(value: Any) -> str:
    """What a JSON value is, in JSON's words (for messages)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    kinds: dict[type, str] = {str: "a string", list: "an array", dict: "an object"}
    return kinds.get(type(value), type(value).__name__)


def _refuse(message: str) -> PydanticCustomError:
    """A validation error whose message is ours alone (no "Value error, " before it); the field is named by its
    location. Given no context, pydantic keeps the template as it is: braces quoted from a dict stay single."""
    return PydanticCustomError("invalid", message)


def check_queries(value: Any, limits: ServiceLimits) -> Any:
    """The ``query`` field: a string or a list of 1 to ``max_queries`` strings, none blank, none longer than
    ``max_query_chars``, each valid Unicode; one message for each mistake (before the declared type's own checks,
    whose messages would name both branches of the union)."""
    many = isinstance(value, list)
    if not many and not isinstance(value, str):
        raise _refuse(f"must be a string or a list of strings, got {_json_kind(value)}")
    queries = value if many else [value]
    if not queries:
        raise _refuse(f"no queries: send a query, or a list of 1 to {limits.max_queries}")
    if len(queries) > limits.max_queries:
        raise _refuse(f"{len(queries)} queries; at most {limits.max_queries} in one request")
    for i, query in enumerate(queries):
        which = f"query {i}" if many else "the query"
        if not isinstance(query, str):
            raise _refuse(f"{which} must be a string, got {_json_kind(query)}")
        if not query.strip():
            raise _refuse(f"{which} is empty" if many else "empty query")
        if len(query) > limits.max_query_chars:
            raise _refuse(f"{which} has {len(query)} characters; at most {limits.max_query_chars}")
        try:
            query.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise _refuse(f"{which} is not valid Unicode (lone surrogate at character {exc.start})") from None
    return value


FilterScalar = StrictStr | StrictBool | StrictInt | StrictFloat | None


class FilterComparison(BaseModel):
    """One comparison of the filter language (:mod:`care_retriever.stores.filters`): ``meta.`` and a dotted path,
    an operator, a typed value (a list for ``in`` / ``not in``; ordering operators take a number or an ISO 8601
    date)."""

    model_config = ConfigDict(extra="forbid")

    field: Annotated[StrictStr, Field(pattern=r"^meta\.[\w\-]+(\.[\w\-]+)*$", examples=["meta.year"])]
    operator: Literal["==", "!=", ">", ">=", "<", "<=", "in", "not in"]
    value: FilterScalar | Annotated[list[FilterScalar], Field(min_length=1, max_length=256)]


class FilterLogic(BaseModel):
    """AND (all), OR (any) or NOT (not all) of filter conditions."""

    model_config = ConfigDict(extra="forbid")

    operator: Literal["AND", "OR", "NOT"]
    conditions: Annotated[list["FilterComparison | FilterLogic"], Field(min_length=1, max_length=64)]


ShortFilterValue = FilterScalar | Annotated[list[FilterScalar], Field(min_length=1, max_length=256)]
# The filter grammar as the OpenAPI schema declares it: a Haystack comparison, a logical node, or the short form
# {"dotted.key": value | [values]} (keys AND-ed). Tried in that order; the stores' own parser checks the rest.
RequestFilters = Annotated[
    FilterComparison | FilterLogic | Annotated[dict[str, ShortFilterValue], Field(max_length=32)],
    Field(union_mode="left_to_right"),
]


def request_model(limits: ServiceLimits, store: VectorStore) -> type[SearchBody]:
    """The /search body, with the limits baked into its validation (and its schema)."""
    query_text = Annotated[StrictStr, StringConstraints(min_length=1, max_length=limits.max_query_chars)]

    class SearchRequest(SearchBody):
        model_config = ConfigDict(extra="forbid")

        query: query_text | Annotated[list[query_text], Field(min_length=1, max_length=limits.max_queries)]
        top_k: StrictInt = Field(10, ge=1, le=limits.max_top_k)
        filters: RequestFilters | None = None
        mode: Literal["dense", "sparse", "hybrid"] = "dense"  # hybrid: the store's BM25 side fused (docs/hybrid.md)

        @field_validator("query", mode="before")
        @classmethod
        def _queries(cls, value: Any) -> Any:
            return check_queries(value, limits)

        @field_validator("filters", mode="before")
        @classmethod
        def _filters(cls, value: Any) -> Any:
            try:  # the stores' own rule, so a filter that passes here is one the store can match
                validate_filters(value)
            except InputError as exc:
                raise _refuse(str(exc)) from None
            return value

        @field_validator("mode", mode="before")
        @classmethod
        def _mode(cls, value: Any) -> Any:
            if value in ("sparse", "hybrid"):
                try:
                    sparse_store(store)
                except CareError as exc:
                    raise _refuse(f"{value!r} needs the store's BM25 side: {exc}") from None
            return value

    return SearchRequest


def _location(loc: Sequence[Any]) -> str:
    """A field's place in the body as a user writes it: ``filters.topic``, ``query[1]`` (FastAPI's ``body`` prefix
    dropped)."""
    parts = list(loc[1:] if loc and loc[0] == "body" else loc)
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _line_and_column(text: Any, offset: int) -> str:
    if not isinstance(text, str):
        return f"character {offset + 1}"
    line = text.count("\n", 0, offset) + 1
    column = offset - (text.rfind("\n", 0, offset) + 1) + 1
    return f"line {line} column {column}"


def validation_answer(exc: RequestValidationError) -> tuple[int, str]:
    """(status, one line) for a body FastAPI could not read or pydantic refused: 400 when the body is not JSON
    (empty or malformed: the line and column, never a byte offset posing as a field), 422 naming the fields."""
    errors = list(exc.errors())
    first = errors[0] if errors else {}
    where = _location(first.get("loc", ()))
    if first.get("type") == "json_invalid":
        offset = first["loc"][-1] if isinstance(first.get("loc", (None,))[-1], int) else 0
        reason = (first.get("ctx") or {}).get("error", "malformed")
        return 400, f"request body is not valid JSON ({_line_and_column(exc.body, offset)}: {reason})"
    if not where and first.get("type") == "missing":
        return 400, 'request body is empty: send a JSON object such as {"query": "..."}'
    if not where and isinstance(first.get("input"), (bytes, str)):  # sent without a JSON content type: read raw
        try:
            json.loads(first["input"])
        except json.JSONDecodeError as bad:
            return 400, f"request body is not valid JSON (line {bad.lineno} column {bad.colno}: {bad.msg})"
        except ValueError:  # not UTF-8
            return 400, "request body is not valid JSON (not UTF-8 text)"
        # JSON, but FastAPI read it as raw bytes: the request named another content type (curl -d sends a form's)
        return 422, 'request body is JSON but not sent as JSON: send the header "Content-Type: application/json"'
    if not where:
        return 422, f"request body must be a JSON object, got {_json_kind(first.get('input'))}"
    parts = [f"{_location(e.get('loc', ()))}: {e.get('msg', 'invalid')}" for e in errors[:3]]
    more = len(errors) - 3
    return 422, "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


class StrictJSONResponse(JSONResponse):
    """Every JSON body the service sends, written by the package's one JSON writer: strict JSON, which any parser
    reads (no NaN or Infinity token)."""

    def render(self, content: Any) -> bytes:
        return strict_json.dumps(content, compact=True).encode("utf-8")


def error_response(status: int, message: str, headers: Mapping[str, str] | None = None) -> StrictJSONResponse:
    return StrictJSONResponse(ErrorBody(error=message).model_dump(), status_code=status, headers=headers)
