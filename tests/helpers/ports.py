"""A free TCP port on the loopback interface (for a one-process gloo group's ``init_method``)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port that nothing listens on now (the OS picks it; it stays free unless another process takes it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
