"""Headless Chromium (Debian ``chromium``) driven over the DevTools protocol from Python, for
tests that must see a page as a browser lays it out.

    async with chromium(tmp_path) as browser:
        page = await browser.page(390, 844, mobile=True)
        await page.goto("http://127.0.0.1:9733/")
        boxes = await page.evaluate("...js returning JSON...")
        png = await page.screenshot()

The protocol (https://chromedevtools.github.io/devtools-protocol/): one websocket to the
browser target; ``Target.createTarget`` + ``Target.attachToTarget`` with ``flatten`` give a
session id that later commands carry; ``Emulation.setDeviceMetricsOverride`` sets the
viewport (``mobile`` makes the page's viewport meta count, as on a phone);
``Page.captureScreenshot`` returns a base64 PNG.  Chromium is started as the machine notes
say (root: ``--no-sandbox``; a closed network: no background networking, no component
updates, no sync, no QUIC) with a fresh ``--user-data-dir``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
)
LISTENING = re.compile(r"DevTools listening on (ws://\S+)")


def require_chromium() -> str:
    path = shutil.which("chromium")
    if path:
        return path
    reason = "needs chromium (Debian package 'chromium', installed by scripts/test.sh)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but {reason}")
    pytest.skip(reason)


class Browser:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse):
        self.ws = ws
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._events: dict[tuple[str | None, str], list[asyncio.Future[Any]]] = {}
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for msg in self.ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue
            data = json.loads(msg.data)
            if "id" in data:
                fut = self._waiting.pop(data["id"], None)
                if fut is not None and not fut.done():
                    if "error" in data:
                        fut.set_exception(RuntimeError(f"CDP error: {data['error']}"))
                    else:
                        fut.set_result(data.get("result", {}))
            else:
                key = (data.get("sessionId"), data.get("method", ""))
                for fut in self._events.pop(key, []):
                    if not fut.done():
                        fut.set_result(data.get("params", {}))

    async def send(
        self, method: str, params: dict[str, Any] | None = None, session: str | None = None
    ) -> Any:
        ident = next(self._ids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[ident] = fut
        msg: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session is not None:
            msg["sessionId"] = session
        await self.ws.send_str(json.dumps(msg))
        return await asyncio.wait_for(fut, 30)

    def event(self, method: str, session: str | None) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._events.setdefault((session, method), []).append(fut)
        return fut

    async def page(self, width: int, height: int, mobile: bool = False) -> Page:
        target = await self.send("Target.createTarget", {"url": "about:blank"})
        attached = await self.send(
            "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}
        )
        page = Page(self, attached["sessionId"], width, height)
        await page.send("Page.enable")
        await page.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile},
        )
        return page

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.send("Browser.close")
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


class Page:
    def __init__(self, browser: Browser, session: str, width: int, height: int):
        self.browser = browser
        self.session = session
        self.width = width
        self.height = height

    async def send(self, method: str, params: dict[str, Any] | None = None) -> Any:
        return await self.browser.send(method, params, self.session)

    async def goto(self, url: str) -> None:
        loaded = self.browser.event("Page.loadEventFired", self.session)
        result = await self.send("Page.navigate", {"url": url})
        if result.get("errorText"):
            raise RuntimeError(f"navigation to {url} failed: {result['errorText']}")
        await asyncio.wait_for(loaded, 30)

    async def evaluate(self, expression: str) -> Any:
        result = await self.send(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True}
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def screenshot(self, full_page: bool = True) -> bytes:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            metrics = await self.send("Page.getLayoutMetrics")
            size = metrics["cssContentSize"]
            params["captureBeyondViewport"] = True
            params["clip"] = {
                "x": 0,
                "y": 0,
                "width": self.width,
                "height": min(size["height"], 16384),
                "scale": 1,
            }
        shot = await self.send("Page.captureScreenshot", params)
        return base64.b64decode(shot["data"])


@contextlib.asynccontextmanager
async def chromium(tmp_path: Path) -> AsyncIterator[Browser]:
    exe = require_chromium()
    profile = tmp_path / "chromium-profile"
    profile.mkdir(exist_ok=True)
    proc = await asyncio.create_subprocess_exec(
        exe,
        *FLAGS,
        f"--user-data-dir={profile}",
        "about:blank",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        # Its singleton socket directory goes to TMPDIR, and stays when it is stopped by a
        # signal: under the test's own tmp_path, not one more /tmp/org.chromium.* per run.
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert proc.stderr is not None
    drain: asyncio.Task[None] | None = None
    try:
        url = None
        seen: list[str] = []

        async def find() -> str:
            while True:
                line = await proc.stderr.readline()  # type: ignore[union-attr]
                if not line:
                    raise RuntimeError("chromium exited: " + " | ".join(seen[-5:]))
                text = line.decode(errors="replace")
                seen.append(text.strip())
                m = LISTENING.search(text)
                if m:
                    return m.group(1)

        url = await asyncio.wait_for(find(), 60)

        async def drain_stderr() -> None:
            while await proc.stderr.readline():  # type: ignore[union-attr]
                pass

        drain = asyncio.create_task(drain_stderr())
        async with (
            aiohttp.ClientSession() as session,
            session.ws_connect(url, max_msg_size=0) as ws,
        ):
            browser = Browser(ws)
            try:
                yield browser
            finally:
                await browser.close()
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        if drain is not None:
            drain.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await drain


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR; AssertionError if ``data`` is not a PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
