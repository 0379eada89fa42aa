"""Small shared utilities (clocks, ids)."""
