"""A small real HTTP server (127.0.0.1 only) that speaks the parts of the Hugging Face hub protocol
that huggingface-hub's downloads use, for tests:

- GET /api/models/OWNER/NAME[/revision/REV]: the repository's file list (`siblings`, with sizes
  and LFS sha256 when ?blobs=true);
- HEAD / GET /OWNER/NAME/resolve/REV/PATH: the file, with the hub's headers (X-Repo-Commit,
  X-Linked-Etag = sha256, X-Linked-Size, ETag, Accept-Ranges) and byte ranges (206 Content-Range);
  404 with X-Error-Code: EntryNotFound for a missing file, 401 without the expected token.

Faults for tests: `cut[path] = n` makes the next GET of that file send its full Content-Length
but only n bytes, then drop the connection (an interrupted transfer); `corrupt` serves a file with
one byte flipped while advertising the right sha256 (a hash mismatch); `gone` lists a file but
answers 404 when it is fetched. Every request is logged
(method, path, Range header, Authorization header).
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

COMMIT = "5d0f4c3a2b1e0f9d8c7b6a5948372615a4b3c2d1"


class Hub:
    def __init__(self, repos: dict[str, dict[str, bytes]], token: str | None = None):
        self.repos = repos
        self.token = token
        self.cut: dict[str, int] = {}
        self.corrupt: set[str] = set()
        self.gone: set[str] = set()
        self.log: list[tuple[str, str, str | None, str | None]] = []
        self._srv = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._srv.daemon_threads = True
        self._thread = threading.Thread(target=self._srv.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._srv.server_address[1]}"

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._srv.shutdown()
        self._srv.server_close()

    def ranges(self, path_suffix: str) -> list[str | None]:
        return [r for m, p, r, _ in self.log if m == "GET" and p.endswith(path_suffix)]

    def _handler(self):
        hub = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # quiet
                pass

            def _send(self, code: int, headers: dict[str, str], body: bytes = b"") -> None:
                self.send_response(code)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _authorized(self) -> bool:
                return hub.token is None or self.headers.get("Authorization") == f"Bearer {hub.token}"

            def _route(self):
                u = urlparse(self.path)
                path = unquote(u.path)
                hub.log.append((self.command, path, self.headers.get("Range"), self.headers.get("Authorization")))
                if not self._authorized():
                    return self._send(401, {"X-Error-Code": "RepoNotFound",
                                            "X-Error-Message": "Invalid credentials in Authorization header"},
                                      b'{"error":"Invalid credentials"}')
                parts = path.strip("/").split("/")
                if parts[:2] == ["api", "models"] and len(parts) >= 4:
                    repo = "/".join(parts[2:4])
                    if repo not in hub.repos:
                        return self._send(404, {"X-Error-Code": "RepoNotFound"}, b'{"error":"Repository not found"}')
                    sib = [{"rfilename": n, "size": len(b), "blobId": hashlib.sha1(b).hexdigest(),
                            "lfs": {"size": len(b), "sha256": hashlib.sha256(b).hexdigest(), "pointerSize": 134}}
                           for n, b in sorted(hub.repos[repo].items())]
                    body = json.dumps({"id": repo, "modelId": repo, "sha": COMMIT, "private": False,
                                       "siblings": sib}).encode()
                    return self._send(200, {"Content-Type": "application/json"}, body)
                if len(parts) >= 5 and parts[2] == "resolve":
                    repo, name = "/".join(parts[:2]), "/".join(parts[4:])
                    files = hub.repos.get(repo)
                    if files is None:
                        return self._send(404, {"X-Error-Code": "RepoNotFound"}, b"Repository not found")
                    if name not in files or name in hub.gone:
                        return self._send(404, {"X-Error-Code": "EntryNotFound",
                                                "X-Error-Message": "Entry not found"}, b"Entry not found")
                    return self._file(name, files[name])
                return self._send(404, {}, b"not found")

            def _file(self, name: str, data: bytes):
                sha = hashlib.sha256(data).hexdigest()
                if name in hub.corrupt:
                    data = bytes([data[0] ^ 0xFF]) + data[1:]
                n = len(data)
                common = {"X-Repo-Commit": COMMIT, "X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(n),
                          "ETag": f'"{sha}"', "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
                start = 0
                rng = self.headers.get("Range")
                if rng and rng.startswith("bytes="):
                    a = rng[len("bytes="):].split("-")[0]
                    start = int(a) if a else 0
                body = data[start:]
                code = 206 if start else 200
                if start:
                    common["Content-Range"] = f"bytes {start}-{n - 1}/{n}"
                if self.command == "GET" and name in hub.cut:
                    keep = hub.cut.pop(name)
                    self.send_response(code)
                    for k, v in common.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body[:keep])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                return self._send(code, common, body)

            def do_GET(self):
                self._route()

            def do_HEAD(self):
                self._route()

        return H
