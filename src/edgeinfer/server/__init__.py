"""Transports (``http``) and the composition root that wires and runs everything (``app``)."""
