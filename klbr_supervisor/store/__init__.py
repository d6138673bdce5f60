"""The cell log: every session, generation, cell, output and event in one SQLite file."""

from .records import CellRecord
from .store import Store, StoreError

__all__ = ["CellRecord", "Store", "StoreError"]
