"""The lake: Spark jobs over the commit log and the Delta tables they keep.

* :mod:`.tables`   -- every lake table (name, location, schema, partitioning), once;
  ``ensure_table`` creates them.
* :mod:`.delta_io` -- Delta without the delta-spark jars: exactly-once appends through
  delta-rs, the snapshot reader that hands Spark a file list, maintenance.
* :mod:`.session`  -- the process's one SparkSession (``get_spark``).
* :mod:`.sql`      -- every table as a temporary view; ``run_sql``.

Imports flow one way: this package may use ``platform.common`` and ``platform.client``;
nothing under ``platform/`` imports it (or PySpark).
"""
