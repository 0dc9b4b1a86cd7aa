#!/usr/bin/env python3
"""Figure: an upload that is a spike -> the alert at a webhook receiver, in seconds.

The whole service runs in-process, built from a configuration as ``capalarm run`` builds it:
a ``type: registry, api: pypi`` source polling a real pypiserver on loopback every
``--interval`` seconds, one surface on it, the webhook destination pointing at a loopback
receiver.  ``--uploads`` wheels of ``--size`` bytes are uploaded with twine, each at a random
phase of the poll schedule; the clock starts when twine returns (the registry holds the file)
and stops when the receiver has ``alert.firing``.

Anchor, in the same run: the poll interval.  A poller finds an upload at the next poll, on
average half an interval later, at worst one; what lies beyond that is the poll itself
(pypiserver serves HTML only, so each new file costs a HEAD for its size and time), the tick
that counts it, and delivery.  Poll lag (how late each poll started against its schedule) and
poll duration are printed too.

So that one upload fires at once the surface has ``spike.absolute_bytes_per_second`` (a rate
that is always a spike) and no budget; it resolves within ``resolve_hold`` (1 s), and the
notifier's flap damper and reopen window are off (each upload is an incident).

    python bench/registry_upload_alert.py [--uploads 9] [--interval 2] [--size 20000]
                                          [--tick 0.5]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import logging
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# After site-packages: an installed capalarm is what runs.
sys.path.append(str(Path(__file__).resolve().parents[1]))

from alarm.config import config_from_dict
from alarm.service import Service
from bench.spike_receiver import SpikeReceiver
from tests.registries.clients import make_wheel, twine_upload
from tests.registries.servers import pypiserver

SOURCE = "internal-pypi"


async def run(args: argparse.Namespace) -> dict[str, list[float]]:
    async with SpikeReceiver() as hook:
        received = hook.received
        detected: list[float] = []
        out: dict[str, list[float]] = {
            "detector": [],
            "hook": [],
            "twine": [],
            "lag": [],
            "poll": [],
        }
        rng = random.Random(args.seed)
        with tempfile.TemporaryDirectory(prefix="capalarm-upload-") as tmp:
            (Path(tmp) / "pypi").mkdir()
            (Path(tmp) / "wheels").mkdir()
            with pypiserver(Path(tmp) / "pypi") as server:
                cfg = config_from_dict(
                    {
                        "tick": args.tick,
                        "state_dir": f"{tmp}/state",
                        "http": {"listen": "127.0.0.1:0"},
                        "sources": [
                            {
                                "name": SOURCE,
                                "type": "registry",
                                "api": "pypi",
                                "url": server.url,
                                "interval": args.interval,
                            }
                        ],
                        "surfaces": [
                            {
                                "name": SOURCE,
                                "kind": "registry",
                                "match": {"source": [SOURCE]},
                                # One upload of --size in one tick is above this: always a spike.
                                "spike": {
                                    "absolute_bytes_per_second": args.size / args.tick / 10,
                                    "resolve_hold": "1s",
                                },
                                "budget": {
                                    "allowance_bits_per_second": 1e12,
                                    "tolerance_bits": 1e15,
                                },
                            }
                        ],
                        "notifications": hook.notifications(tmp),
                    }
                )

                def on_change(change: Any) -> None:
                    if change.rule == "spike" and change.state == "firing":
                        detected.append(time.time())

                service = Service(cfg, on_change=on_change)
                task = asyncio.create_task(service.run())
                try:
                    await asyncio.wait_for(service.started.wait(), 10)
                    poller: Any = dict(service.collectors)[SOURCE]
                    while not poller.health.last_success_at:
                        await asyncio.sleep(0.05)

                    async def each_poll() -> None:
                        """Lag and duration of every poll (sampled as each one completes)."""
                        seen = 0.0
                        while True:
                            h = poller.health
                            if h.last_success_at != seen:
                                seen = h.last_success_at
                                out["lag"].append(poller.lag)
                                out["poll"].append(h.read_seconds)
                            await asyncio.sleep(0.01)

                    sampler = asyncio.create_task(each_poll())
                    for u in range(args.uploads):
                        # A random phase of the poll schedule, and time for the last alert to
                        # resolve.
                        await asyncio.sleep(2.0 + rng.uniform(0, args.interval))
                        wheel = make_wheel(Path(tmp) / "wheels", f"spike{u}", "1.0", args.size)
                        n_recv, n_det = len(received), len(detected)
                        began = time.time()
                        await asyncio.to_thread(twine_upload, server, wheel)
                        t0 = time.time()
                        while len(received) == n_recv and time.time() < t0 + 3 * args.interval + 10:
                            await asyncio.sleep(0.01)
                        if len(received) == n_recv:
                            print(f"upload {u + 1}: no alert", file=sys.stderr)
                            continue
                        out["twine"].append(t0 - began)
                        out["detector"].append(detected[n_det] - t0)
                        out["hook"].append(received[n_recv] - t0)
                        print(
                            f"upload {u + 1}: twine {t0 - began:.3f}s, then detector "
                            f"{out['detector'][-1]:.3f}s, webhook {out['hook'][-1]:.3f}s"
                        )
                    sampler.cancel()
                finally:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--uploads", type=int, default=9)
    ap.add_argument("--interval", type=float, default=2.0)
    ap.add_argument("--size", type=int, default=20_000, help="random bytes in each wheel")
    ap.add_argument("--tick", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if importlib.util.find_spec("pypiserver") is None or importlib.util.find_spec("twine") is None:
        print("pypiserver and twine (PyPI) are needed", file=sys.stderr)
        return 1
    logging.basicConfig(level=logging.ERROR)
    got = asyncio.run(run(args))
    if not got["hook"]:
        print("no upload was alerted", file=sys.stderr)
        return 1
    med = statistics.median
    print(
        f"\nupload (a spike) -> alert, median of {len(got['hook'])} uploads to pypiserver on "
        f"loopback; poll interval {args.interval:g}s, tick {args.tick:g}s; the surface has "
        "spike.absolute_bytes_per_second (a rate that is always a spike)"
    )
    print(f"  anchor  poll interval                           {args.interval:7.3f} s")
    print(f"          (an upload waits for the next poll: on average {args.interval / 2:.3f} s)")
    print(f"          upload -> detector fires                {med(got['detector']):7.3f} s")
    print(f"  figure  upload -> webhook received              {med(got['hook']):7.3f} s")
    print(
        f"          poll lag median {med(got['lag']) * 1000:.1f} ms, max "
        f"{max(got['lag']) * 1000:.1f} ms, and poll duration median "
        f"{med(got['poll']) * 1000:.1f} ms, over {len(got['lag'])} polls; twine upload itself "
        f"{med(got['twine']):.3f} s (not in the figure)"
    )
    print(
        "  code path: registry poller (PEP 503 index page, project pages, HEAD of the new "
        "file) -> pipeline (event-time tick) -> detector -> outbox -> signed webhook"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
