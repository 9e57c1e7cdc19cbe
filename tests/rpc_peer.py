"""A loopback stand-in for a ggml-rpc server of a chosen protocol version (tests only).

It answers HELLO with `version`, then any command found in `answers` (command number -> reply payload);
like a real rpc-server, an unknown command ends the connection. Every command received is recorded in
`seen`, in order.
"""

from __future__ import annotations

import socket
import struct
import threading

from harness import rpc
from harness.util import HarnessError


class RpcPeer:
    def __init__(self, version: tuple[int, int, int], answers: dict[int, bytes] | None = None):
        self.version = version
        self.answers = dict(answers or {})
        self.seen: list[int] = []
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def hellos(self) -> int:
        return self.seen.count(rpc.RPC_CMD_HELLO)

    def _reply(self, conn: socket.socket, payload: bytes) -> None:
        conn.sendall(struct.pack("<Q", len(payload)) + payload)

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(30)
                try:
                    while True:
                        cmd, size = struct.unpack("<BQ", rpc._recv_exact(conn, 9, "request header"))
                        if size:
                            rpc._recv_exact(conn, size, "request")
                        self.seen.append(cmd)
                        if cmd == rpc.RPC_CMD_HELLO:
                            self._reply(conn, bytes(self.version) + b"\0" + bytes(rpc.RPC_CONN_CAPS_SIZE))
                        elif cmd in self.answers:
                            self._reply(conn, self.answers[cmd])
                        else:
                            break   # unknown to this server: drop the connection, as rpc-server does
                except (HarnessError, OSError):
                    pass

    def close(self) -> None:
        self.sock.close()
