"""text package."""
