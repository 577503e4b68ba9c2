"""The control plane: what concerns the whole server (``scope.py``), and the one object the admin routes
of both transports call (``plane.py``)."""
