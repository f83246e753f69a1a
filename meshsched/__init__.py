"""meshsched: a scheduler for deep-learning training on clusters of GPU servers."""
