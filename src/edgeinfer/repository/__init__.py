"""Where models come from (``sources``), how a version is loaded and warmed up (``loader``), and the
registry of loaded versions that requests are routed to (``registry``)."""
