"""Canonical frames: schemas, the Trace container and the interval kernel."""
