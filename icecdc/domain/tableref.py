"""How a table is named: one value instead of strings built three ways.

A configured table is ``namespace.table`` (``db.orders``, or ``a.b.orders`` for nested
namespaces); Spark SQL and the Java API want it qualified by the catalog (``lake.db.orders``),
pyiceberg wants it without. ``TableRef`` carries the three parts and says both, and the branch
icecdc commits to: ``main``, or the table's staging branch (docs/compactor.md, "Staged commits").
"""

from __future__ import annotations

from dataclasses import dataclass

MAIN_BRANCH = "main"  # Iceberg's SnapshotRef.MAIN_BRANCH: the ref every reader reads


@dataclass(frozen=True)
class TableRef:
    catalog: str
    namespace: tuple[str, ...]
    name: str
    # The branch the ingester and the compactor commit to and read from. Readers read ``main``.
    branch: str = MAIN_BRANCH

    @classmethod
    def of(cls, catalog: str, identifier: str, branch: str = MAIN_BRANCH) -> TableRef:
        """From the catalog name and a configured ``namespace.table`` identifier."""
        *namespace, name = identifier.split(".")
        if not namespace or not name:
            raise ValueError(f"table name {identifier!r} must be namespace.table (e.g. db.orders)")
        return cls(catalog, tuple(namespace), name, branch)

    @property
    def staged(self) -> bool:
        """Whether commits go to a staging branch, ``main`` following it once portable."""
        return self.branch != MAIN_BRANCH

    @property
    def identifier(self) -> str:
        """``namespace.table``: how the configuration, pyiceberg and the events name the table."""
        return ".".join((*self.namespace, self.name))

    @property
    def qualified(self) -> str:
        """``catalog.namespace.table``: how Spark SQL and Iceberg's Spark catalog name it."""
        return f"{self.catalog}.{self.identifier}"

    @property
    def qualified_namespace(self) -> str:
        return ".".join((self.catalog, *self.namespace))

    def __str__(self) -> str:
        return self.qualified
