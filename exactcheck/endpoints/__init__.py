"""endpoints."""
