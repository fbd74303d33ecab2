"""sparkmq: a RocketMQ-style message platform whose brokers are long-running Spark services.

The repository root is this package; README.md ("What is here") describes the layout.
``platform/`` deliberately has no ``__init__.py`` so the standard library's
``platform`` module is never shadowed; import its parts as ``sparkmq.platform.<component>``.
"""

__version__ = "0.1.0"
