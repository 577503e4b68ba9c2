"""Dynamic batching: which queued requests run together (``policy``) and the queue that runs them
(``batcher``)."""
