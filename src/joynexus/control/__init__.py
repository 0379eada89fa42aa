"""control package."""
