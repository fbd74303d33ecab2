"""Builds the C core of the store; everything else is declared in pyproject.toml."""
from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "sparkmq.storage_native._commitlog",
            sources=["storage_native/_commitlog.c"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
        )
    ]
)
