"""Everything that manages workbench generations. Knows nothing of frontends."""
