"""Builds the C core of the store; everything else is declared in pyproject.toml."""
from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "sparkmq.storage_native._commitlog",
            sources=[
                "storage_native/_commitlog.c",
                "storage_native/cl_store.c",
                "storage_native/crc32.c",
                "storage_native/v2_codec.c",
                "storage_native/rmq_codec.c",
            ],
            depends=["storage_native/cl_store.h", "storage_native/crc32.h", "storage_native/growbuf.h",
                     "storage_native/v2_codec.h", "storage_native/rmq_codec.h"],
            extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter", "-pthread"],
            extra_link_args=["-pthread"],
        )
    ]
)
