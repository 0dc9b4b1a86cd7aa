"""The HTTP side's listening socket, whose TLS setting can change while it listens.

Each connection is served with the TLS context current when it was accepted: none, plain
HTTP; otherwise the connection is held (not read) until ``loop.start_tls`` has done the
server handshake, and aiohttp's protocol then takes it over together with whatever arrived
right after the handshake.  A rotated certificate, a new client-certificate policy or a
switch between http and https applies from the next connection, and the socket is never
closed or re-opened, so no connection is refused or dropped in between; open connections
finish with the context they started with.

Why not a second listener on a duplicate of the socket, with the old one closed once the
new one runs: asyncio (3.11 to 3.13) drops a connection that the old server accepted in the
same loop turn as its close (``Server._attach`` asserts the server is still open, the
error is swallowed, and the client waits for a reply that never comes).  Swapping under
load lost one to two connections in a hundred that way (bench/tls_reload.py).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Callable

log = logging.getLogger("capalarm.http")

# As asyncio's own default for TLS servers: a client that connects and stays silent holds
# its connection at most this long.
HANDSHAKE_TIMEOUT = 60.0


class Listener:
    """Serves ``protocol_factory``'s protocol (aiohttp's request handler) on one socket."""

    def __init__(
        self, protocol_factory: Callable[[], asyncio.Protocol], context: ssl.SSLContext | None
    ):
        # The TLS context for connections accepted from now on; None: plain HTTP.
        self.context = context
        self.handshake_failures = 0
        self._factory = protocol_factory
        self._server: asyncio.Server | None = None
        self._handshakes: set[_Handshake] = set()

    async def start(self, sock: socket.socket) -> None:
        """Serve connections accepted on ``sock`` (a bound, listening socket it now owns)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._accepted, sock=sock)

    def close(self) -> None:
        """Stop accepting and drop handshakes still under way (established connections
        are aiohttp's to close)."""
        if self._server is not None:
            self._server.close()
        for handshake in list(self._handshakes):
            handshake.abort()

    def _accepted(self) -> asyncio.Protocol:
        if self.context is None:
            return self._factory()
        return _Handshake(self, self.context)

    def _handshake_done(self, handshake: _Handshake, failure: Exception | None) -> None:
        self._handshakes.discard(handshake)
        if failure is not None:
            self.handshake_failures += 1
            log.debug("TLS handshake failed: %s", failure)


class _Handshake(asyncio.Protocol):
    """A TLS connection's protocol until its handshake is done; then it hands the
    connection, and anything that arrived meanwhile, to the listener's protocol."""

    def __init__(self, listener: Listener, context: ssl.SSLContext):
        self._listener = listener
        self._context = context
        self._transport: asyncio.Transport | None = None
        self._task: asyncio.Task[None] | None = None
        self._app: asyncio.Protocol | None = None
        self._early: list[bytes] = []
        self._eof = False
        self._lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        # Nothing may be read before start_tls runs (a turn later): it would be the
        # ClientHello, read as if it were application data.
        transport.pause_reading()
        self._transport = transport
        self._listener._handshakes.add(self)
        self._task = asyncio.get_running_loop().create_task(self._handshake(transport))

    async def _handshake(self, transport: asyncio.Transport) -> None:
        loop = asyncio.get_running_loop()
        try:
            tls = await loop.start_tls(
                transport,
                self,
                self._context,
                server_side=True,
                ssl_handshake_timeout=HANDSHAKE_TIMEOUT,
            )
        except Exception as exc:  # a bad or silent client: its connection only
            self._listener._handshake_done(self, exc)
            transport.abort()
            return
        self._listener._handshake_done(self, None)
        if self._lost or tls is None:
            return
        app = self._listener._factory()
        tls.set_protocol(app)
        self._app = app
        app.connection_made(tls)
        for chunk in self._early:
            app.data_received(chunk)
        self._early.clear()
        if self._eof and not app.eof_received():
            tls.close()

    def abort(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._transport is not None:
            self._transport.abort()
        self._listener._handshake_done(self, None)

    # Until the handover these arrive here (the request often comes in the same read as the
    # client's Finished); after it, anything already scheduled for this protocol is passed on.
    def data_received(self, data: bytes) -> None:
        if self._app is not None:
            self._app.data_received(data)
        else:
            self._early.append(data)

    def eof_received(self) -> bool | None:
        if self._app is not None:
            return self._app.eof_received()
        self._eof = True
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        if self._app is not None:
            self._app.connection_lost(exc)
        else:
            self._lost = True
