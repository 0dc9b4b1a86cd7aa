#!/usr/bin/env python3
"""Figure: what diffing a registry listing costs, and what each tracked artifact weighs.

    python bench/registry_diff.py [--artifacts 100000] [--per-group 10] [--new 100] [--reps 7]

Builds the listing index (alarm/collectors/registry/listing.py) of ``--artifacts`` artifacts in
groups of ``--per-group`` (a project's files, an image's tags), then times one steady-state
poll's work in-process: hashing every listed identity and diffing every group, with ``--new``
artifacts new.  Prints the CPU time of that (median of --reps, ``time.process_time``), split
into hashing and diffing, and the index's memory per tracked artifact (tracemalloc, the index
alone), next to the anchor of a plain ``dict[str, set[str]]`` of the same identities.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

if __package__ in (None, ""):
    sys.path.append(
        str(Path(__file__).resolve().parents[1])
    )  # after site-packages: an installed capalarm is what runs

from alarm.collectors.registry.listing import ArtifactIndex, hashes_of


def listing(artifacts: int, per_group: int, generation: int, new: int) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for i in range(artifacts):
        g = f"project-{i // per_group:07d}"
        groups.setdefault(g, []).append(f"{g}-{i}.whl#sha256:{i:064x}")
    for j in range(new * generation):  # uploads since the first listing, spread over groups
        g = f"project-{(j * 7919) % (artifacts // per_group):07d}"
        groups[g].append(f"{g}-new{j}.whl#sha256:{j:064x}")
    return groups


def poll(index: ArtifactIndex, groups: dict[str, list[str]]) -> tuple[float, float, int]:
    t0 = time.process_time()
    hashed = {g: hashes_of(ids) for g, ids in groups.items()}
    t1 = time.process_time()
    new = 0
    for g, current in hashed.items():
        diff = index.diff(g, current)
        index.commit(diff)
        new += len(diff.new)
    index.take_changes()
    return t1 - t0, time.process_time() - t1, new


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--artifacts", type=int, default=100_000)
    ap.add_argument("--per-group", type=int, default=10)
    ap.add_argument("--new", type=int, default=100)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args(argv)

    index = ArtifactIndex()
    poll(index, listing(args.artifacts, args.per_group, 0, args.new))
    hashing, diffing = [], []
    for rep in range(1, args.reps + 1):
        groups = listing(args.artifacts, args.per_group, rep, args.new)
        h, d, new = poll(index, groups)
        assert new == args.new, new
        hashing.append(h)
        diffing.append(d)
    tracked = index.artifacts()

    # Memory: the index alone, built from one listing (the hashed listing freed again).
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    fresh = ArtifactIndex()
    hashed = {g: hashes_of(ids) for g, ids in listing(args.artifacts, args.per_group, 0, 0).items()}
    for g, current in hashed.items():
        fresh.commit(fresh.diff(g, current))
    fresh.take_changes()
    del hashed, current
    index_bytes = tracemalloc.get_traced_memory()[0] - before
    plain_start = tracemalloc.get_traced_memory()[0]
    plain = {g: set(ids) for g, ids in listing(args.artifacts, args.per_group, 0, 0).items()}
    plain_bytes = tracemalloc.get_traced_memory()[0] - plain_start  # the sets and their strings
    tracemalloc.stop()
    del plain

    h, d = statistics.median(hashing), statistics.median(diffing)
    print(
        f"registry listing diff: {args.artifacts:,} artifacts in groups of {args.per_group}, "
        f"{args.new} new per poll, median of {args.reps}"
    )
    print(
        f"  CPU per poll      {1000 * (h + d):8.1f} ms  (hashing {1000 * h:.1f} ms, diffing {1000 * d:.1f} ms)"
    )
    print(
        f"  memory / artifact {index_bytes / args.artifacts:8.1f} B   (index of {tracked:,} hashes in {len(index):,} groups)"
    )
    print(
        f"  anchor: dict[str, set[str]] of the identities: {plain_bytes / args.artifacts:.1f} B / artifact"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
