"""The socket `care-retriever serve` binds gives connections with Nagle's algorithm off.

With Nagle on, a response written in two parts (headers, body) waits for the client's delayed ACK:
every keep-alive request after a connection's first took ~40 ms more (measured on loopback: /health
44 ms on a reused connection, 3 ms on a new one). asyncio switches Nagle off on accepted connections
only when the listening socket is declared TCP, which is what this checks, on the server's own path.
"""

from __future__ import annotations

import asyncio
import socket

from care_retriever.cli.serve import bind_socket


def test_accepted_connections_have_nagle_off() -> None:
    async def accept_one() -> int:
        sock = bind_socket("127.0.0.1", 0)
        seen: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        class Probe(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                accepted = transport.get_extra_info("socket")
                seen.set_result(accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                transport.close()

        server = await asyncio.get_running_loop().create_server(Probe, sock=sock)
        _, writer = await asyncio.open_connection("127.0.0.1", sock.getsockname()[1])
        try:
            return await asyncio.wait_for(seen, 10)
        finally:
            writer.close()
            server.close()
            await server.wait_closed()

    assert asyncio.run(accept_one()) != 0
