"""A webhook receiver for tests/integration/test_channels_daemon.py, standard library only: it
runs inside the network namespace the test made and appends every request as one JSON line
(path, headers, body) to ``--log``, answering 200. The first line says it is ready."""

from __future__ import annotations

import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOCK = threading.Lock()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--listen", required=True, help="ADDRESS:PORT")
    parser.add_argument("--log", required=True)
    args = parser.parse_args()
    host, port = args.listen.rsplit(":", 1)

    def write(entry: dict[str, object]) -> None:
        with LOCK, open(args.log, "a", encoding="utf-8") as log:
            log.write(json.dumps(entry) + "\n")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = self.rfile.read(length)
            if len(body) < length:  # the sender went away mid-request (a killed daemon): no
                self.close_connection = True  # delivery happened, so none is logged
                return
            write({"path": self.path, "headers": dict(self.headers.items()),
                   "body": body.decode("utf-8", "replace")})  # fmt: skip
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer((host, int(port)), Handler)
    write({"listener": "ready"})
    server.serve_forever()


if __name__ == "__main__":
    main()
