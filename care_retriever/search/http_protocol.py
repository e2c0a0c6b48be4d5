"""The HTTP/1.1 protocol ``care-retriever serve`` runs under uvicorn: h11, answering a request that is not valid HTTP
with the service's one error body.

uvicorn parses the request line and headers before the app sees a request, and answers what it cannot parse (a
Content-Length that is not a number, a garbage request line) itself, with a plain-text 400. The service's contract
is one JSON body for every error (``ErrorBody``, docs/reference/http-service.md), so this protocol writes that body
instead. It is h11's protocol, named to uvicorn as a class, so the service runs on h11 even where httptools is
installed (uvicorn's ``auto`` would pick httptools, whose 400 is plain text too).
"""

from __future__ import annotations

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from care_retriever import strict_json
from care_retriever.search.service_schema import ErrorBody

INVALID_HTTP = (
    "request is not valid HTTP/1.1 (a malformed request line or header, such as a non-numeric Content-Length)"
)


class ErrorBodyH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, but its 400 for a request it cannot parse is ``{"error": "..."}``."""

    def send_400_response(self, msg: str) -> None:
        body = strict_json.dumps(ErrorBody(error=INVALID_HTTP).model_dump(), compact=True).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        self.transport.write(self.conn.send(h11.Response(status_code=400, headers=headers, reason=b"Bad Request")))
        self.transport.write(self.conn.send(h11.Data(data=body)))
        self.transport.write(self.conn.send(h11.EndOfMessage()))
        self.transport.close()
