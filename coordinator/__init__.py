"""What keeps the writer and the compactors from failing each other's commits, and keeps two
compactor replicas off the same partition."""
