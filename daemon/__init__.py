"""meshd: the per-server daemon (transport and lifecycle around the engine)."""
