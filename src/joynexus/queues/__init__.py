"""queues package."""
