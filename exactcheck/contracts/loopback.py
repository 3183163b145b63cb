"""A local HTTP server for the length of a ``with`` block: what the mutant proxies, the toy served
model and the test fakes have in common (127.0.0.1 only, a free port, a daemon thread, always shut)."""
from __future__ import annotations

import threading

__all__ = ["LoopbackServer"]


class LoopbackServer:
    """Base of a context manager that serves ``self.server`` (a ``socketserver`` bound to
    ``("127.0.0.1", 0)``) in a daemon thread: a subclass builds the server in ``__init__`` or in
    its own ``__enter__`` and calls ``self.serve(server)``; ``url`` is its address; leaving the
    block shuts it down and joins the thread."""

    poll_interval = 0.1
    server = None

    def serve(self, server) -> None:
        self.server = server
        self.thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": self.poll_interval},
                                       daemon=True)
        self.thread.start()

    def __enter__(self):
        self.serve(self.server)
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)
