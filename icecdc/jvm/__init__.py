"""The one adapter to Iceberg's Java API, reached through py4j for what Spark SQL and pyiceberg
cannot do: committing equality deletes, rewriting one partition in one commit, converting
deletes, maintenance actions that tag their snapshots.

No py4j call happens outside this package
(``tests/unit/test_static_checks.py::test_no_py4j_outside_the_java_adapter`` checks it). Callers
get typed Python objects, never Java handles, and Python exceptions of ``icecdc.domain.errors``:
``bridge`` translates Java's once, at this boundary.

- ``bridge``: the JVM of a Spark session, Java values py4j does not make on its own, and the
  translation of Java exceptions;
- ``tables``: one table: its snapshots, and the tagged commits icecdc makes to it;
- ``listing``: one partition's live files at one snapshot;
- ``rewrites``: rewriting data files through Spark, registering position deletes, and the
  compaction's one commit;
- ``actions``: snapshot expiry, orphan-file removal, manifest rewrites.
"""
