"""The optional native scanner; everything else is in pyproject.toml.

``optional=True``: where no C compiler is available the install still succeeds and
alarm.collectors.kernel.fastscan uses its pure-Python path (same results, slower)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "alarm.collectors.kernel._fastscan",
            ["alarm/collectors/kernel/_fastscan.c"],
            extra_compile_args=["-O2", "-fno-fast-math"],
            optional=True,
        )
    ]
)
