"""The lake: Spark jobs over the commit log and the Delta tables they keep.

* :mod:`.tables`      -- every lake table (name, location, schema, partitioning, properties), once;
  ``ensure_table`` creates them with delta-spark, ``register_tables`` names them ``sparkmq.<table>``.
* :mod:`.session`     -- the process's one SparkSession (``get_spark``), always with Delta Lake.
* :mod:`.dispatch`, :mod:`.trace_job`, :mod:`.dlq_job`, :mod:`.reports` -- the jobs; Delta's
  ``txnAppId``/``txnVersion`` make their appends exactly once.
* :mod:`.maintenance` -- ``OPTIMIZE``, ``VACUUM``, checkpoints.
* :mod:`.sql`         -- ``run_sql``: Spark SQL over a lake's tables (``sparkmq sql``).

Imports flow one way: this package may use ``platform.common`` and ``platform.client``;
nothing under ``platform/`` imports it (or PySpark).
"""
