"""A real HTTP server on 127.0.0.1 serving shard bytes from a dict, counting the GETs of
each file: what the ShardStore and ShardedDataset tests download remote shards from."""

from __future__ import annotations

import contextlib
import http.server
import threading
import time
from collections import Counter
from collections.abc import Iterator


class ShardFiles(http.server.BaseHTTPRequestHandler):
    """Serves `files` (name -> bytes) by path; `gets` counts the GETs per name."""

    files: dict[str, bytes] = {}
    gets: Counter[str] = Counter()
    delay_s = 0.0

    def _send_head(self) -> bytes | None:
        data = self.files.get(self.path.lstrip("/"))
        if data is None:
            self.send_error(404)
            return None
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        return data

    def do_HEAD(self) -> None:  # noqa: N802 (http.server's names)
        self._send_head()

    def do_GET(self) -> None:  # noqa: N802
        self.gets[self.path.lstrip("/")] += 1
        time.sleep(self.delay_s)  # widens the window in which other pins ask too
        data = self._send_head()
        if data is not None:
            self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def serve_files(files: dict[str, bytes]) -> Iterator[tuple[str, type[ShardFiles]]]:
    """(url, handler class) of a server of `files` on 127.0.0.1, for the block."""
    handler = type("Handler", (ShardFiles,), {"files": dict(files), "gets": Counter()})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()
