"""The ``capalarm`` command: run, check-config, demo, backtest, deploy-files.

Every way a command can fail ends in one line on stderr and an exit status, never a
traceback: 2 for bad configuration or input (the line names the key or file), 1 for a runtime
failure (a busy port, a state directory that cannot be written, a state database that is
locked, damaged or of another schema version, a kernel log that cannot be read)."""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import TYPE_CHECKING, Any, NoReturn

from alarm import logs
from alarm.detector.fused import NativeMissing

if TYPE_CHECKING:
    from alarm.config import Config

# Each command imports what it needs when it runs (the config models, the service, numpy):
# importing them all here made `capalarm --version` cost ~0.5 s of CPU (issue 29).

EXIT_RUNTIME = 1
EXIT_CONFIG = 2


def fail(status: int, message: str) -> NoReturn:
    print(f"capalarm: {message}", file=sys.stderr)
    sys.exit(status)


def _load(path: str | None) -> Config:
    from alarm.config import ConfigError, load_config

    try:
        return load_config(path)
    except ConfigError as exc:
        where = path or "embedded default"
        if len(exc.problems) == 1 and exc.problems[0].startswith("(file): "):
            fail(EXIT_CONFIG, exc.problems[0].removeprefix("(file): "))
        # Every problem, each naming its key, on the one line.
        fail(EXIT_CONFIG, f"invalid configuration ({where}): " + "; ".join(exc.problems))


def _listen(value: str) -> str:
    """--listen, validated as http.listen is."""
    from pydantic import ValidationError

    from alarm.config import HttpConfig

    try:
        return HttpConfig(listen=value).listen
    except ValidationError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not HOST:PORT (e.g. 127.0.0.1:9733)"
        ) from None


# More worker processes than this is a typo, not a machine: each is a process, and the pool
# starts them all.
MAX_WORKERS = 256
# The demo runs at most a day: "inf" would be a run that never ends.
MAX_DEMO_SECONDS = 86400.0


def _workers(value: str) -> int:
    """--workers: 1 to MAX_WORKERS processes."""
    try:
        n = int(value)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_WORKERS:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a number of processes (1-{MAX_WORKERS})"
        )
    return n


def _duration(value: str) -> float:
    """--duration: seconds, more than 0 and at most MAX_DEMO_SECONDS (nan and inf refused)."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds <= MAX_DEMO_SECONDS:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a duration in seconds (more than 0, at most {MAX_DEMO_SECONDS:g})"
        )
    return seconds


def _web_config(path: str | None) -> Any:
    """--web.config.file, validated (exit 2 naming every problem's key) before anything
    starts."""
    if not path:
        return None
    from exporters.webconfig import WebConfigError, load_web_config

    try:
        return load_web_config(path)
    except WebConfigError as exc:
        if len(exc.problems) == 1 and exc.problems[0].startswith("(file): "):
            fail(EXIT_CONFIG, exc.problems[0].removeprefix("(file): "))
        fail(EXIT_CONFIG, f"invalid web config ({path}): " + "; ".join(exc.problems))


def cmd_run(args: argparse.Namespace) -> int:
    import asyncio
    import sqlite3
    from pathlib import Path

    from alarm.collectors.base import SourceUnavailable
    from alarm.config import ConfigError
    from alarm.service import Service, ServiceError, run_until_signalled
    from alarm.state import StateError, storage_cause

    config = _load(args.config)
    if args.state_dir:
        config = config.model_copy(update={"state_dir": args.state_dir})
    if args.listen:
        config = config.model_copy(
            update={"http": config.http.model_copy(update={"listen": args.listen})}
        )
    web_config = _web_config(args.web_config_file)
    try:
        service = Service(config, config_path=args.config, web_config=web_config)
    except SourceUnavailable as exc:
        fail(EXIT_RUNTIME, str(exc))
    except ConfigError as exc:
        # Problems only visible at start, such as a secret that cannot be read.
        fail(EXIT_CONFIG, "invalid configuration: " + "; ".join(exc.problems))
    except StateError as exc:  # locked, damaged, read-only, of another schema version
        fail(EXIT_RUNTIME, str(exc))
    except sqlite3.Error as exc:  # found reading what the store opened (a truncated file)
        db = Path(config.state_dir) / "capalarm.db"
        fail(EXIT_RUNTIME, f"cannot use the state database {db}: {storage_cause(exc, db)}")
    except OSError as exc:
        where = exc.filename or config.state_dir
        fail(
            EXIT_RUNTIME,
            f"cannot use state directory {config.state_dir}: {exc.strerror or exc} ({where}; "
            "use --state-dir to choose another)",
        )
    try:
        asyncio.run(run_until_signalled(service))
    except ServiceError as exc:
        fail(EXIT_RUNTIME, str(exc))
    return 0


def cmd_check_config(args: argparse.Namespace) -> int:
    # `run` and `backtest` take --config; check-config takes it too, or the file alone.
    path = args.config or args.file
    if path is None or (args.config and args.file):
        fail(EXIT_CONFIG, "check-config: give one config file (FILE or --config FILE)")
    from alarm.config import config_warnings

    config = _load(path)
    # Valid but almost certainly not meant (a config that watches nothing): said on stderr,
    # and on the ok line, with exit 0 all the same.
    warnings = config_warnings(config)
    for warning in warnings:
        print(f"capalarm: warning: {path}: {warning}", file=sys.stderr)
    said = f", {len(warnings)} warning{'s' * (len(warnings) != 1)}" if warnings else ""
    print(
        f"{path}: ok ({len(config.sources)} sources, {len(config.surfaces)} surfaces, "
        f"tick {config.tick:g}s{said})"
    )
    return 0


def cmd_backtest(args: argparse.Namespace) -> int:
    from alarm.backtest import main_backtest

    config = _load(args.config)
    return main_backtest(config, args.inputs, args.output, args.workers)


def cmd_demo(args: argparse.Namespace) -> int:
    import asyncio

    from alarm.demo import run_demo
    from alarm.service import ServiceError

    try:
        return asyncio.run(run_demo(duration=args.duration, listen=args.listen))
    except ServiceError as exc:
        fail(EXIT_RUNTIME, str(exc))


def cmd_deploy_files(args: argparse.Namespace) -> int:
    from pathlib import Path

    from alarm.deployfiles import DeployFilesError, write

    try:
        done = write(Path(args.dir), force=args.force)
    except DeployFilesError as exc:
        fail(EXIT_RUNTIME, f"deploy-files: {exc}")
    for path, what in done:
        print(f"{what} {path}")
    return 0


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """--help shows each option's default, except where there is none to show (None, False):
    "(default: None)" would say nothing, and such options say in their help what happens
    without them."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


class VersionAction(argparse.Action):
    """--version: the version, revision, Python and native paths (alarm/buildinfo.py), looked
    up only when asked for (git describe is a process)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        kwargs.setdefault("help", "show version, revision, Python and native paths, and exit")
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> NoReturn:
        from alarm.buildinfo import version_text

        print(version_text())
        parser.exit(0)


class OneLineParser(argparse.ArgumentParser):
    """argparse, with its errors in one line (no usage block), exit status 2, and --help
    showing defaults (in every verb too: add_parser makes subparsers of this class)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        fail(EXIT_CONFIG, f"{self.prog.removeprefix('capalarm').strip() or 'usage'}: {message}")


def _log_level(value: str) -> str:
    try:
        return logs.level_name(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a log level ({', '.join(logs.LEVELS)})"
        ) from None


def _log_options(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    """--log.level and --log.format, before the verb (``capalarm --log.level debug run``) or
    after it (``capalarm run --log.level debug``), as users of the Prometheus tools type them.
    After the verb the defaults are suppressed: a verb's own default would otherwise overwrite
    what was given before it."""
    level_default = "info" if defaults else argparse.SUPPRESS
    format_default = "plain" if defaults else argparse.SUPPRESS
    # A suppressed default is not shown by the help formatter: say it here.
    after = "" if defaults else " (default: as given before the verb, else %s)"
    # --log-level is the older spelling; scripts use it, so it stays.
    parser.add_argument(
        "--log.level",
        "--log-level",
        dest="log_level",
        type=_log_level,
        default=level_default,
        metavar="LEVEL",
        help=f"least severe log lines shown: {', '.join(logs.LEVELS)} (warn is warning)"
        + (after % "info" if after else ""),
    )
    parser.add_argument(
        "--log.format",
        dest="log_format",
        choices=logs.FORMATS,
        default=format_default,
        help="plain text, logfmt, or one JSON object per line; timestamps in UTC"
        + (after % "plain" if after else ""),
    )


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="capalarm", description="Write-volume capacity alarm for confined workloads."
    )
    parser.add_argument("--version", action=VersionAction)
    _log_options(parser, defaults=True)
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser(
        "run", help="run the service (embedded default config when --config is not given)"
    )
    run.add_argument("--config", help="YAML config file (without it: the embedded default)")
    run.add_argument("--state-dir", help="override the config's state_dir")
    run.add_argument("--listen", type=_listen, help="override the config's http.listen (host:port)")
    run.add_argument(
        "--web.config.file",
        dest="web_config_file",
        metavar="FILE",
        help="TLS and basic auth, in the exporter-toolkit web config format node_exporter uses",
    )
    _log_options(run, defaults=False)
    run.set_defaults(func=cmd_run)

    check = sub.add_parser(
        "check-config", help="validate a config: exit 0, or 2 naming every problem"
    )
    check.add_argument("file", nargs="?", help="YAML config file")
    check.add_argument("--config", help="YAML config file (the same as FILE)")
    _log_options(check, defaults=False)
    check.set_defaults(func=cmd_check_config)

    demo = sub.add_parser("demo", help="self-contained demo: generated fence traffic with a spike")
    demo.add_argument("--duration", type=_duration, default=60.0, help="seconds to run")
    demo.add_argument(
        "--listen",
        type=_listen,
        default=None,
        help="host:port for the status page (default 127.0.0.1:9733, or a free port if taken)",
    )
    _log_options(demo, defaults=False)
    demo.set_defaults(func=cmd_demo)

    bt = sub.add_parser(
        "backtest", help="replay recorded input and write the alerts that would have fired"
    )
    bt.add_argument("--config", help="YAML config file (without it: the embedded default)")
    bt.add_argument("--output", "-o", help="JSON lines file (default: stdout)")
    bt.add_argument(
        "--workers", type=_workers, help=f"worker processes, 1-{MAX_WORKERS} (default: CPU count)"
    )
    bt.add_argument(
        "inputs",
        nargs="+",
        help="kmsg dump, dmesg text, kern.log, journalctl -o json, or write-event JSON lines",
    )
    _log_options(bt, defaults=False)
    bt.set_defaults(func=cmd_backtest)

    files = sub.add_parser(
        "deploy-files",
        help="write the example config, systemd unit, nftables fence, Prometheus rules and "
        "Grafana dashboards the package carries into DIR (at their repository paths)",
    )
    files.add_argument("dir", metavar="DIR", help="directory to write into (created if needed)")
    files.add_argument(
        "--force", action="store_true", help="overwrite files that exist with other contents"
    )
    _log_options(files, defaults=False)
    files.set_defaults(func=cmd_deploy_files)
    return parser


def main(argv: list[str] | None = None) -> int:
    # numpy's OpenBLAS starts a thread per core when numpy is imported, ~0.05 s of CPU in
    # every capalarm process and backtest worker (a third of a short backtest's start-up);
    # nothing in capalarm multiplies matrices.  An operator's own setting stands.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    args = build_parser().parse_args(argv)
    logs.setup(args.log_level, args.log_format)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130
    except NativeMissing as exc:  # a broken install: one line, not a traceback
        print(f"capalarm: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
