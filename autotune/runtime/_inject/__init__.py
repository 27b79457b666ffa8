"""Put first on a trial's PYTHONPATH when its command is not ``python …`` (a shell wrapper, say)."""
