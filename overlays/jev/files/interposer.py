"""The jev overlay's interposer: an HTTP proxy on API_PORT in front of vLLM's OpenAI API on PORT (standard library
only). Every request (method, path, query, body, Content-Type, Accept, Authorization) is forwarded as is; the
answer's status, Content-Type and body come back as vLLM sent them; an unreachable vLLM answers 502.

    python interposer.py --upstream http://127.0.0.1:8000 --port 18011 [--host 0.0.0.0]
"""

from __future__ import annotations

import argparse
import http.client
import signal
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FORWARDED = ("Content-Type", "Accept", "Authorization")
MAX_BODY = 64 << 20


def handler(upstream: urllib.parse.SplitResult, timeout: float) -> type[BaseHTTPRequestHandler]:
    class Proxy(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                self._answer(413, b'{"error": "request body too large"}', "application/json")
                return
            body = self.rfile.read(length) if length else None
            headers = {k: v for k in FORWARDED if (v := self.headers.get(k)) is not None}
            conn = http.client.HTTPConnection(upstream.hostname or "127.0.0.1", upstream.port or 80, timeout=timeout)
            try:
                conn.request(self.command, self.path, body=body, headers=headers)
                reply = conn.getresponse()
                data = reply.read()
                self._answer(reply.status, data, reply.getheader("Content-Type") or "application/octet-stream")
            except OSError as exc:
                self._answer(502, f'{{"error": "vLLM is not reachable: {type(exc).__name__}"}}'.encode(),
                             "application/json")
            finally:
                conn.close()

        def _answer(self, status: int, data: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = _forward

        def log_message(self, format: str, *args: object) -> None:
            sys.stderr.write(f"interposer: {self.address_string()} {format % args}\n")

    return Proxy


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="interposer", description=__doc__.split("\n\n")[0])
    p.add_argument("--upstream", required=True, help="vLLM's base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--host", default="0.0.0.0", help="address to listen on")
    p.add_argument("--port", type=int, required=True, help="port to listen on")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for vLLM's answer")
    args = p.parse_args(argv)
    upstream = urllib.parse.urlsplit(args.upstream)
    if upstream.scheme != "http" or not upstream.hostname:
        p.error(f"--upstream {args.upstream!r} is not an http://host:port URL")
    server = ThreadingHTTPServer((args.host, args.port), handler(upstream, args.timeout))
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"interposer: listening on {args.host}:{args.port}, forwarding to {args.upstream}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
