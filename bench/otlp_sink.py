"""An OTLP/HTTP receiver that reads each export and throws it away, for the tracing cost case of
bench/run.py: the server pays for making, serializing and sending its spans; nothing is stored.

    python bench/otlp_sink.py PORT      # prints "ready" once listening; counts exports on stdout at exit
"""

from __future__ import annotations

import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

exports = 0


class Sink(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the exporter's session expects

    def do_POST(self) -> None:
        global exports
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        exports += 1
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")  # an empty ExportTraceServiceResponse
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Sink)
    signal.signal(signal.SIGTERM, lambda *_: (print(f"exports {exports}", flush=True), sys.exit(0)))
    print("ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
