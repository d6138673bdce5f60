"""The cell log: every session, generation, cell, output and event in one SQLite file."""

from .store import Store, StoreError
from .records import CellRecord

__all__ = ["CellRecord", "Store", "StoreError"]
