"""The ``capalarm`` command: run, check-config, demo, backtest."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from alarm import __version__
from alarm.config import ConfigError, load_config

EXIT_CONFIG = 2


def _load(path: str | None):
    try:
        return load_config(path)
    except ConfigError as exc:
        where = path or "embedded default"
        print(f"capalarm: invalid configuration ({where}):", file=sys.stderr)
        for problem in exc.problems:
            print(f"  {problem}", file=sys.stderr)
        sys.exit(EXIT_CONFIG)


def cmd_run(args: argparse.Namespace) -> int:
    from alarm.service import NoKernelLog, Service, run_until_signalled

    config = _load(args.config)
    if args.state_dir:
        config = config.model_copy(update={"state_dir": args.state_dir})
    if args.listen:
        config = config.model_copy(
            update={"http": config.http.model_copy(update={"listen": args.listen})}
        )
    try:
        service = Service(config)
    except NoKernelLog as exc:
        print(f"capalarm: {exc}", file=sys.stderr)
        return 1
    except ConfigError as exc:
        # Problems only visible at start, such as a secret that cannot be read.
        print("capalarm: invalid configuration:", file=sys.stderr)
        for problem in exc.problems:
            print(f"  {problem}", file=sys.stderr)
        return EXIT_CONFIG
    except PermissionError as exc:
        print(
            f"capalarm: {exc.strerror}: {exc.filename} (use --state-dir to choose another)",
            file=sys.stderr,
        )
        return 1
    asyncio.run(run_until_signalled(service))
    return 0


def cmd_check_config(args: argparse.Namespace) -> int:
    config = _load(args.file)
    print(
        f"{args.file}: ok ({len(config.sources)} sources, {len(config.surfaces)} surfaces, "
        f"tick {config.tick:g}s)"
    )
    return 0


def cmd_backtest(args: argparse.Namespace) -> int:
    from alarm.backtest import main_backtest

    config = _load(args.config)
    return main_backtest(config, args.inputs, args.output, args.workers)


def cmd_demo(args: argparse.Namespace) -> int:
    from alarm.demo import run_demo

    return asyncio.run(run_demo(duration=args.duration, listen=args.listen))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="capalarm", description="Write-volume capacity alarm for confined workloads."
    )
    parser.add_argument("--version", action="version", version=f"capalarm {__version__}")
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser(
        "run", help="run the service (embedded default config when --config is not given)"
    )
    run.add_argument("--config", help="YAML config file")
    run.add_argument("--state-dir", help="override state_dir")
    run.add_argument("--listen", help="override http.listen (host:port)")
    run.set_defaults(func=cmd_run)

    check = sub.add_parser(
        "check-config", help="validate a config: exit 0, or 2 naming every problem"
    )
    check.add_argument("file")
    check.set_defaults(func=cmd_check_config)

    demo = sub.add_parser("demo", help="self-contained demo: generated fence traffic with a spike")
    demo.add_argument("--duration", type=float, default=60.0, help="seconds to run (default 60)")
    demo.add_argument("--listen", default="127.0.0.1:9733")
    demo.set_defaults(func=cmd_demo)

    bt = sub.add_parser(
        "backtest", help="replay recorded input and write the alerts that would have fired"
    )
    bt.add_argument("--config", required=True)
    bt.add_argument("--output", "-o", help="JSON lines file (default: stdout)")
    bt.add_argument("--workers", type=int, help="worker processes (default: CPU count)")
    bt.add_argument(
        "inputs",
        nargs="+",
        help="kmsg dump, dmesg text, kern.log, journalctl -o json, or write-event JSON lines",
    )
    bt.set_defaults(func=cmd_backtest)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
