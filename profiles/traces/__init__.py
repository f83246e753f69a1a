"""Packaged copies of public cluster traces (data only; see README.md here)."""
