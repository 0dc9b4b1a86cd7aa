#!/usr/bin/env python3
"""Figure: connections lost while the HTTP listener's TLS certificate changes under load.
Anchor: the way it was done before, in the same run: a second aiohttp listener on a
duplicate of the socket, the old one closed once the new one runs.

    python bench/tls_reload.py [--changes 300] [--clients 4] [--reps 3]

Each rep: ``--clients`` threads open TLS connections back to back and GET a page while the
certificate alternates between two ``--changes`` times, 20 ms apart.  A connection is lost
when it gets no answer within 2 s.  Medians over the reps are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

REPO = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):
    sys.path.append(str(REPO))  # after site-packages: an installed capalarm is what runs

from exporters.listener import Listener  # noqa: E402

REQUEST = b"GET / HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n"


def certificates(d: Path) -> list[ssl.SSLContext]:
    contexts = []
    for name in ("a", "b"):
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
             "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", f"{name}.key",
             "-out", f"{name}.crt", "-days", "1", "-subj", f"/CN={name}"],
            cwd=d, check=True, capture_output=True,
        )  # fmt: skip
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(d / f"{name}.crt", d / f"{name}.key")
        contexts.append(ctx)
    return contexts


async def hammer(
    port: int, clients: int, change: Callable[[int], Awaitable[None]], changes: int
) -> tuple[int, int]:
    """(answered, lost) connections while ``change(i)`` runs ``changes`` times."""
    client_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client_ctx.check_hostname = False
    client_ctx.verify_mode = ssl.CERT_NONE
    stop = threading.Event()
    counts = [0, 0]
    lock = threading.Lock()

    def client() -> None:
        while not stop.is_set():
            try:
                with (
                    socket.create_connection(("127.0.0.1", port), timeout=2) as raw,
                    client_ctx.wrap_socket(raw) as tls,
                ):
                    tls.sendall(REQUEST)
                    ok = tls.recv(12) == b"HTTP/1.1 200"
            except OSError:
                ok = False
            with lock:
                counts[0 if ok else 1] += 1

    threads = asyncio.gather(*(asyncio.to_thread(client) for _ in range(clients)))
    try:
        for i in range(changes):
            await change(i)
            await asyncio.sleep(0.02)
    finally:
        stop.set()
        await threads
    return counts[0], counts[1]


async def one_rep(contexts: list[ssl.SSLContext], args: argparse.Namespace, mode: str):
    async def page(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    app = web.Application()
    app.router.add_get("/", page)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    sock = socket.create_server(("127.0.0.1", 0), backlog=128)
    sock.setblocking(False)
    port = sock.getsockname()[1]
    try:
        if mode == "listener":
            assert runner.server is not None
            listener = Listener(runner.server, contexts[0])
            await listener.start(sock)

            async def change(i: int) -> None:
                listener.context = contexts[(i + 1) % 2]

            result = await hammer(port, args.clients, change, args.changes)
            listener.close()
        else:
            sites = [web.SockSite(runner, sock.dup(), ssl_context=contexts[0])]
            await sites[0].start()

            async def change(i: int) -> None:
                new = web.SockSite(runner, sock.dup(), ssl_context=contexts[(i + 1) % 2])
                await new.start()
                await sites[0].stop()
                sites[0] = new

            result = await hammer(port, args.clients, change, args.changes)
    finally:
        await runner.cleanup()
        sock.close()
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--changes", type=int, default=300)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        contexts = certificates(Path(d))
        for mode, label in (
            ("listener", "figure: exporters/listener.py, the context changed in place"),
            ("swap", "anchor: a second listener on a dup of the socket, the old one closed"),
        ):
            runs = [asyncio.run(one_rep(contexts, args, mode)) for _ in range(args.reps)]
            answered = statistics.median(a for a, _ in runs)
            lost = statistics.median(b for _, b in runs)
            print(
                f"{label}: {args.changes} certificate changes, {args.clients} clients: "
                f"median {answered:.0f} connections answered, {lost:.0f} lost "
                f"(reps: {', '.join(str(b) for _, b in runs)} lost)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
