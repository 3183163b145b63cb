"""forcing."""
