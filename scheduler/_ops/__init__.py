"""Operators' tools that read and write across the rooms: ``explain`` (why a task ran, or did
not) and ``backfill`` (one job per past slot)."""
