"""Measured throughputs and fitted model parameters (data only; see README.md here)."""
