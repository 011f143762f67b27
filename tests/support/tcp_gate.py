"""A TCP gate in front of a real server, for tests that take the server "down" and bring it back: `close()` refuses
new connections and resets the open ones (as a stopped server does), `open()` listens again on the same port. The
server itself keeps running, so a test pays for one start of it (an `mlflow server` start is ~9 CPU-s)."""
from __future__ import annotations

import socket
import threading


class TcpGate:
    def __init__(self, target_port: int, host: str = "127.0.0.1"):
        self.host, self.target_port = host, target_port
        self.port = 0
        self._listener: socket.socket | None = None
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()

    @property
    def uri(self) -> str:
        return f"http://{self.host}:{self.port}"

    def open(self) -> "TcpGate":
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.host, self.port))
        listener.listen(16)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    def close(self) -> None:
        """Refuse new connections and reset the open ones."""
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        with self._lock:
            conns, self._conns = self._conns, set()
        for conn in conns:
            _reset(conn)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # closed
                return
            try:
                upstream = socket.create_connection((self.host, self.target_port), timeout=10)
            except OSError:
                _reset(client)
                continue
            upstream.settimeout(None)
            with self._lock:
                if self._listener is not listener:  # closed meanwhile
                    _reset(client)
                    _reset(upstream)
                    return
                self._conns.update((client, upstream))
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for conn in (source, sink):
            with self._lock:
                self._conns.discard(conn)
            _reset(conn)


def _reset(conn: socket.socket) -> None:
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    conn.close()
