"""``capalarm demo``: the whole service on generated fence traffic, with a local webhook
receiver, so a newcomer sees rates, a spike alarm and a capacity-budget alarm fire and resolve
within about a minute."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import tempfile
import time

from aiohttp import web

from alarm.collectors.kernel.synthetic import Flow, SyntheticCollector
from alarm.config import config_from_dict
from alarm.service import Service

DEFAULT_LISTEN = "127.0.0.1:9733"

DEMO_SPIKE_AT = 22.0
DRIP_FROM, DRIP_TO = 5.0, 20.0
DEMO_SPIKE_FOR = 10.0


def demo_config(state_dir: str, listen: str, webhook_url: str) -> dict:
    return {
        "tick": "1s",
        "state_dir": state_dir,
        "http": {"listen": listen},
        "sources": [{"name": "demo"}],
        "surfaces": [
            {
                "name": "registry-proxy",
                "kind": "egress",
                "match": {"dst": ["10.20.0.0/16"], "dport": [443], "proto": ["tcp"]},
                # A minute is far too little history for a calibrated threshold (the surface is
                # "learning" all demo long): an absolute one shows the spike rule at work.
                "spike": {
                    "absolute_bytes_per_second": 60_000,
                    "resolve_hold": "4s",
                    "floor_bytes_per_second": 2048,
                },
            },
            {
                "name": "paste-board",
                "kind": "egress",
                "match": {"dst": ["10.30.0.7/32"], "dport": [80], "proto": ["tcp"]},
                "spike": {"enabled": False},
                "budget": {
                    "allowance_bits_per_second": 800,
                    "tolerance_bits": 16000,
                    "resolve_hold": "3s",
                },
            },
        ],
        "webhooks": [{"url": webhook_url, "name": "demo-receiver", "max_retries": 3}],
        # Resolves at once: the demo lasts a minute, not the ten a flap may reopen an incident.
        "notifications": {"flap": {"reopen_window": "0s"}},
    }


def demo_flows() -> list[Flow]:
    return [
        # steady package downloads' requests through the proxy, then a 20x burst
        Flow("10.20.1.10", 443, "TCP", 20, 600),
        Flow(
            "10.20.1.10",
            443,
            "TCP",
            400,
            600,
            start=DEMO_SPIKE_AT,
            end=DEMO_SPIKE_AT + DEMO_SPIKE_FOR,
        ),
        # a slow drip to a message board: ~1.9 kbit/s against an 800 bit/s allowance
        Flow("10.30.0.7", 80, "TCP", 4, 60, start=DRIP_FROM, end=DRIP_TO),
    ]


def port_free(listen: str) -> bool:
    host, _, port = listen.rpartition(":")
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        try:
            s.bind((host.strip("[]"), int(port)))
        except OSError:
            return False
    return True


async def run_demo(duration: float = 60.0, listen: str | None = None) -> int:
    """``listen`` None: the default port, or a free one if it is taken (and say so); a port
    given explicitly that is taken is a ServiceError naming it."""
    if listen is None:
        listen = DEFAULT_LISTEN
        if not port_free(listen):
            print(f"capalarm demo: {listen} is taken; using a free port instead", flush=True)
            listen = "127.0.0.1:0"
    received: list[dict] = []

    async def receive(request: web.Request) -> web.Response:
        payload = await request.json()
        received.append(payload)
        print(f"  webhook received: {payload['state'].upper():8} {payload['summary']}", flush=True)
        return web.Response(status=204)

    app = web.Application()
    app.add_routes([web.post("/hook", receive)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    hook_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    with tempfile.TemporaryDirectory(prefix="capalarm-demo-") as state_dir:
        config = config_from_dict(
            demo_config(state_dir, listen, f"http://127.0.0.1:{hook_port}/hook")
        )
        collector = SyntheticCollector("demo", demo_flows(), tick=config.tick)
        service = Service(config, collectors={"demo": collector})

        task = asyncio.create_task(service.run())
        started = asyncio.create_task(service.started.wait())
        await asyncio.wait([task, started], return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            started.cancel()
            await runner.cleanup()
            task.result()  # raises what stopped the service (a busy port: ServiceError)
            return 1
        base = f"http://{listen.split(':')[0]}:{service.http_port}"
        print(
            f"capalarm demo: {duration:.0f}s of generated fence traffic, 1s ticks.\n"
            f"  status page  {base}/\n  metrics      {base}/metrics\n"
            f"  surfaces     {base}/api/v1/surfaces\n"
            f"  a 20x burst on 'registry-proxy' starts at {DEMO_SPIKE_AT:.0f}s; a slow drip to "
            f"'paste-board' runs from {DRIP_FROM:.0f}s to {DRIP_TO:.0f}s.\n",
            flush=True,
        )
        start = time.time()
        with contextlib.suppress(asyncio.CancelledError):
            while time.time() - start < duration:
                await asyncio.sleep(5)
                snap = await service.snapshot()
                rates = ", ".join(f"{s.name} {s.rate:,.0f} B/s" for s in snap.surfaces)
                print(f"[{time.time() - start:4.0f}s] {rates}", flush=True)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await runner.cleanup()
    fired = {(p.get("surface"), p["rule"]) for p in received if p["state"] == "firing"}
    resolved = {(p.get("surface"), p["rule"]) for p in received if p["state"] == "resolved"}
    print(
        f"\ndemo done: {len(received)} webhook notifications; fired {sorted(fired)}, resolved {sorted(resolved)}"
    )
    print(json.dumps({"fired": sorted(fired), "resolved": sorted(resolved)}))
    return 0
