"""The engine, below the facade and above the store: staged versions, the commit path, groups,
generations and rollback."""
