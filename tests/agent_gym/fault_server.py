"""A real TCP server on 127.0.0.1 whose answers the caller writes byte by byte: answers without
Content-Length, dripped or endless bodies, malformed JSON. Used by the HTTP retriever's tests
(tests/agent_gym/test_retrievers.py, tests/envs/test_qa_envs.py) and benchmarks/faults/http_faults.py."""

from __future__ import annotations

import socket
import threading


def read_request(conn: socket.socket) -> None:
    """Read one HTTP request (headers, then Content-Length bytes of body), so that closing the
    connection afterwards sends FIN, not RST (unread data would reset the client's read)."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = conn.recv(65536)
        if not chunk:
            return
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(rest) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return
        rest += chunk


class FaultServer:
    """A real TCP server on 127.0.0.1 that reads each request and then runs ``answer(conn, stop)``
    to write whatever it likes; it counts connections and stops (closing every socket) on
    ``close()``. ``answer`` returns when ``stop`` is set or the client goes away."""

    def __init__(self, answer):
        self.answer = answer
        self.stop = threading.Event()
        self.connections = 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.1)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            self.connections += 1
            with conn:
                conn.settimeout(5)
                try:
                    read_request(conn)
                    self.answer(conn, self.stop)
                except OSError:  # the client closed or shut the socket down
                    continue

    def close(self):
        self.stop.set()
        self.thread.join(timeout=5)
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def dribble(head: bytes, slow: bytes, gap: float = 1.0):
    """Send ``head`` at once, then ``slow`` one byte every ``gap`` seconds."""

    def write(conn, stop):
        conn.sendall(head)
        for b in slow:
            if stop.wait(gap):
                return
            conn.sendall(bytes([b]))

    return write


def drip(head: bytes, gap: float = 0.2):
    """Send ``head`` at once, then a valid-looking JSON body one byte every ``gap`` s, without end."""

    def write(conn, stop):
        conn.sendall(head)
        conn.sendall(b'{"result": [[')
        while not stop.wait(gap):
            conn.sendall(b" ")

    return write


def flood(head: bytes, byte: bytes = b" "):
    """Send ``head`` at once, then 64 KiB blocks of ``byte`` as fast as the client reads, without end."""

    def write(conn, stop):
        conn.sendall(head)
        block = byte * 65536
        while not stop.is_set():
            conn.sendall(block)

    return write


def answer(body: bytes, status: bytes = b"200 OK"):
    """One complete answer with a correct Content-Length."""

    def write(conn, stop):
        conn.sendall(
            b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
            b"Connection: close\r\n\r\n%s" % (status, len(body), body)
        )

    return write
