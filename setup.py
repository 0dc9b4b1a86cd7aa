"""The optional native parts; everything else is in pyproject.toml.

``optional=True``: where no C compiler is available the install still succeeds, and
alarm.collectors.kernel.fastscan, alarm.detector.fused, the backtest's reader of write
events (alarm/backtest.py) and the /metrics writer (exporters/textformat.py) use their
pure-Python paths (same results, slower)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "alarm.collectors.kernel._fastscan",
            ["alarm/collectors/kernel/_fastscan.c"],
            extra_compile_args=["-O2", "-fno-fast-math"],
            optional=True,
        ),
        Extension(
            "alarm._eventscan",
            ["alarm/_eventscan.c"],
            extra_compile_args=["-O2", "-fno-fast-math"],
            optional=True,
        ),
        Extension(
            "exporters._textformat",
            ["exporters/_textformat.c"],
            extra_compile_args=["-O2", "-fno-fast-math"],
            optional=True,
        ),
        Extension(
            "alarm.detector._fused",
            ["alarm/detector/_fused.c", "alarm/detector/_whole_tick.c"],
            depends=["alarm/detector/_fused.h"],
            # No fused multiply-adds: the passes must round where numpy rounds.
            extra_compile_args=["-O3", "-fno-fast-math", "-ffp-contract=off", "-fno-trapping-math"],
            optional=True,
        ),
    ]
)
