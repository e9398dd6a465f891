"""Terminus stores (memory, LMDB, LevelDB)."""
