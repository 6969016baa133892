"""Carrying out the tick's decisions: one dispatcher per way of executing statements."""
