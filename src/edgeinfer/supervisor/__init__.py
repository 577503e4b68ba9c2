"""The process model: a supervisor forking worker processes that serve on the same ports
(``supervisor.py``), the whole server as one scope over them (``cluster.py``), a worker's side of the
link (``worker.py``), and the sockets and event loop both kinds of process start from."""
