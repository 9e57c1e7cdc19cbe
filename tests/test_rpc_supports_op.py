"""The ggml-rpc client asks the server which ops its device supports (patch 0065, issue 16).

At the pin the RPC device answered supports_op with `true` for every op, so the scheduler (and
test-backend-ops) sent a server ops its backend cannot run, and the server aborted (on the H200: a
CUDA rpc-server on a permuted STQ1_0 CPY and on the Hy4 model's 4-head lightning indexer). A CPU
rpc-server supports nearly everything; what its backend really refuses at the pin includes CPY into
the IQ types that have no from_float (IQ2_XXS, ...) and MUL_MAT with a src1 type that is neither F32
nor src0's vec-dot type (Q4_0 x F16). Checked here, against a loopback CPU rpc-server:

- `test-backend-ops perf -b RPC0` (no CPU reference that would skip the case before it is sent) on
  CPY f32 -> iq2_xxs: reported "not supported", the server neither receives it nor dies (at the pin
  the server aborts with "ops.cpp: not implemented" and the client with "Remote RPC server crashed");
- `test-backend-ops support -b RPC0` answers like `-b CPU` for every case of a set of ops;
- the answers are cached: repeated identical queries cost one SUPPORTS_OP at the server (counted in
  its GGML_RPC_DEBUG log), and one client process uses one connection;
- the server answers from the op's description only (garbage in the buffer, data, name and link
  fields changes nothing), and a malformed request ends that connection, never the server;
- an older server (7.0.1; a stand-in speaking the protocol) is never sent the command: every op is
  assumed supported, as before, with a warning naming both versions; a 7.1 stand-in is asked.
"""

from __future__ import annotations

import os
import re
import socket
import struct
import subprocess
from pathlib import Path

import pytest

from harness import rpc, server
from rpc_peer import RpcPeer
from harness.util import HarnessError

pytestmark = pytest.mark.build

# type: (bytes per block, values per block)
TYPE_SIZES = {"F32": (4, 1), "F16": (2, 1), "Q4_0": (18, 32), "IQ2_XXS": (66, 256)}
RPC_TENSOR = struct.Struct("<QIQ4I4II16ii10QQQQ64si")   # ggml-rpc.cpp's packed rpc_tensor
assert RPC_TENSOR.size == 296
GGML_MAX_SRC = 10


def _enum(text: str, name: str, prefix: str) -> dict[str, int]:
    """Members of a C enum in order (explicit `= N` values honoured)."""
    body = re.search(r"enum\s+" + name + r"\s*\{(.*?)\};", text, re.S).group(1)
    out, nxt = {}, 0
    for m in re.finditer(r"^\s*" + prefix + r"(\w+)\s*(?:=\s*(\d+))?\s*,", body, re.M):
        nxt = int(m.group(2)) if m.group(2) else nxt
        out[m.group(1)] = nxt
        nxt += 1
    return out


@pytest.fixture(scope="module")
def ids(llama_tree):
    h = (Path(llama_tree) / "ggml" / "include" / "ggml.h").read_text()
    src = (Path(llama_tree) / "ggml" / "src" / "ggml-rpc" / "ggml-rpc.cpp").read_text()
    out = {"op": _enum(h, "ggml_op", "GGML_OP_"), "type": _enum(h, "ggml_type", "GGML_TYPE_"),
           "cmd": _enum(src, "rpc_cmd", "RPC_CMD_")}
    assert out["type"]["IQ2_XXS"] == 16 and out["cmd"]["HELLO"] == rpc.RPC_CMD_HELLO
    assert "SUPPORTS_OP" in out["cmd"], "the applied tree has no RPC_CMD_SUPPORTS_OP (patch 0065)"
    return out


def _nb(type_: str, ne) -> list[int]:
    size, blck = TYPE_SIZES[type_]
    nb = [size, size * ne[0] // blck]
    nb += [nb[1] * ne[1], nb[1] * ne[1] * ne[2]]
    return nb


# ---------------------------------------------------------------------------------------------
# test-backend-ops --test-file lines (make_test_cases_from_file):
#   op type ne0..ne3 n_params params... n_src (type ne0..ne3 nb0..nb3)... name


def _case(ids, op: str, type_: str, ne, srcs, name: str) -> str:
    parts = [ids["op"][op], ids["type"][type_], *ne, 0, len(srcs)]
    for t, sne in srcs:
        parts += [ids["type"][t], *sne, *_nb(t, sne)]
    return " ".join(str(x) for x in parts) + " " + name


def _cpy(ids, dst: str, name: str) -> str:
    ne = [256, 4, 1, 1]
    return _case(ids, "CPY", dst, ne, [("F32", ne), (dst, ne)], name)


def _tbo(bin_dir: Path, *args, timeout: float = 600) -> subprocess.CompletedProcess:
    p = subprocess.run([str(bin_dir / "test-backend-ops"), *args], text=True, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=timeout)
    return p


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _support(out: str) -> dict[str, bool]:
    """`test-backend-ops support` lines -> {case: supported}."""
    res = {}
    for ln in ANSI.sub("", out).splitlines():
        m = re.match(r"\s+(\S.*): (NOT SUPPORTED|SUPPORTED)\s*$", ln)
        if m:
            res[m.group(1)] = m.group(2) == "SUPPORTED"
    return res


@pytest.fixture(scope="module")
def bin_dir(cpu_build) -> Path:
    d = Path(cpu_build) / "bin"
    for exe in ("test-backend-ops", rpc.EXE):
        if not (d / exe).exists():
            pytest.fail(f"{d / exe} is missing: the CPU build must have -DGGML_RPC=ON and the {rpc.EXE} target")
    return d


@pytest.fixture(scope="module")
def srv(bin_dir):
    """A loopback CPU rpc-server that logs every command (GGML_RPC_DEBUG)."""
    name = f"pytest-supports-op-{os.getpid()}"
    info = rpc.start(bin_dir / rpc.EXE, server.free_port(), threads=1, name=name, env={"GGML_RPC_DEBUG": "1"})
    info["ep"] = f"127.0.0.1:{info['port']}"
    yield info
    rpc.stop(name)


class Log:
    """What the server logged since it was created."""

    def __init__(self, path):
        self.path = Path(path)
        self.start = self.path.stat().st_size

    def text(self) -> str:
        with open(self.path, "rb") as f:
            f.seek(self.start)
            return f.read().decode(errors="replace")


def _alive(info) -> bool:
    return server._alive(info["pid"], rpc.EXE.encode())


# ---------------------------------------------------------------------------------------------


def test_op_the_server_refuses_is_not_sent_to_it(bin_dir, srv, ids, tmp_path):
    cases = tmp_path / "cases.txt"
    cases.write_text(_cpy(ids, "IQ2_XXS", "cpy_iq2_xxs") + "\n" + _cpy(ids, "F16", "cpy_f16") + "\n")
    # the premise: the CPU backend itself refuses the first and runs the second
    local = _support(_tbo(bin_dir, "support", "-b", "CPU", "--test-file", str(cases)).stdout)
    assert sorted(local.values()) == [False, True] and not next(v for k, v in local.items() if "iq2_xxs" in k), \
        f"the CPU backend's answers changed, pick another refused op: {local}"

    log = Log(srv["log"])
    p = _tbo(bin_dir, "perf", "-b", "RPC0", "--rpc", srv["ep"], "--test-file", str(cases), timeout=300)
    out = ANSI.sub("", p.stdout)
    print(out[-2000:])
    srv_log = log.text()
    assert _alive(srv), f"the rpc-server died:\n{srv_log[-3000:]}"
    assert "not implemented" not in srv_log and "crashed" not in out, out[-2000:] + srv_log[-2000:]
    assert p.returncode == 0, out[-3000:]
    iq2 = [ln for ln in out.splitlines() if "cpy_iq2_xxs" in ln]
    f16 = [ln for ln in out.splitlines() if "cpy_f16" in ln]
    assert iq2 and "not supported" in iq2[0], out[-2000:]
    assert f16 and "not supported" not in f16[0] and "us/run" in f16[0], out[-2000:]
    # the server was asked, said no, and computed only the supported copy
    assert re.search(r"\[supports_op\] device: 0, op: CPY, type: iq2_xxs, result: 0", srv_log), srv_log[-3000:]
    assert re.search(r"\[supports_op\] device: 0, op: CPY, type: f16, result: 1", srv_log), srv_log[-3000:]
    assert "[graph_compute]" in srv_log


SUPPORT_OPS = "CPY,SET_ROWS,MUL_MAT,OUT_PROD,SOFT_MAX_BACK,GET_ROWS_BACK,IM2COL_BACK"


def test_support_answers_equal_the_server_backend(bin_dir, srv):
    """Every case of a set of ops: RPC0 (a CPU server) says what the CPU backend says."""
    local = _support(_tbo(bin_dir, "support", "-b", "CPU", "-o", SUPPORT_OPS).stdout)
    p = _tbo(bin_dir, "support", "-b", "RPC0", "--rpc", srv["ep"], "-o", SUPPORT_OPS)
    remote = _support(p.stdout)
    assert p.returncode == 0, p.stdout[-3000:]
    refused = [k for k, v in local.items() if not v]
    print(f"{len(local)} cases, {len(refused)} refused by the CPU backend, e.g. {refused[:3]}")
    assert len(local) > 1000 and len(refused) >= 50, (len(local), len(refused))
    assert remote.keys() == local.keys()
    differ = [k for k in local if local[k] != remote[k]]
    assert not differ, f"{len(differ)} cases answered differently through rpc, e.g. {differ[:5]}"
    assert _alive(srv)


def test_answers_are_cached_and_one_connection_is_used(bin_dir, srv, ids, tmp_path):
    cases = tmp_path / "cases.txt"
    lines = [_cpy(ids, "F16", f"f16_{i}") for i in range(4)] + [_cpy(ids, "IQ2_XXS", f"iq2_{i}") for i in range(3)]
    cases.write_text("\n".join(lines) + "\n")
    log = Log(srv["log"])
    p = _tbo(bin_dir, "support", "-b", "RPC0", "--rpc", srv["ep"], "--test-file", str(cases))
    res = _support(p.stdout)
    srv_log = log.text()
    assert p.returncode == 0, p.stdout[-3000:]
    assert len(res) == 7 and sum(res.values()) == 4, res
    asked = re.findall(r"\[supports_op\].*", srv_log)
    print("\n".join(asked))
    assert len(asked) == 2, f"7 queries, 2 distinct: the server was asked {len(asked)} times"
    assert srv_log.count("Accepted client connection") == 1, srv_log[-3000:]


# ---------------------------------------------------------------------------------------------
# the command on the wire


def _tensor(ids, type_: str, ne, op: str = "NONE", tid: int = 1, junk: bool = False, **kw) -> bytes:
    nb = kw.get("nb") or _nb(type_, ne)
    t = kw.get("type_id", ids["type"].get(type_, 0))
    o = kw.get("op_id", ids["op"].get(op, 0))
    if junk:   # addresses, names and links a client may hold: none of them may change the answer
        return RPC_TENSOR.pack(tid, t, 0xdead0000, *ne, *nb, o, *[0] * 16, 0, *range(7, 7 + GGML_MAX_SRC),
                               0x51de, 64, 0xbad0bad0, b"some name", 3)
    return RPC_TENSOR.pack(tid, t, 0, *ne, *nb, o, *[0] * 16, 0, *[0] * GGML_MAX_SRC, 0, 0, 0, b"", 0)


def _request(device: int, op: bytes, srcs: list[bytes]) -> bytes:
    zero = bytes(RPC_TENSOR.size)
    return struct.pack("<I", device) + op + b"".join(srcs) + zero * (GGML_MAX_SRC - len(srcs))


class Raw:
    def __init__(self, port: int):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.s.sendall(struct.pack("<BQ", rpc.RPC_CMD_HELLO, rpc.RPC_CONN_CAPS_SIZE) + bytes(rpc.RPC_CONN_CAPS_SIZE))
        self.version = tuple(rpc._recv_exact(self.s, 8 + rpc.HELLO_RSP_SIZE, "HELLO")[8:11])

    def ask(self, cmd: int, data: bytes, size: int | None = None) -> bytes | None:
        """The response, or None when the server closed the connection."""
        n = len(data) if size is None else size
        self.s.sendall(struct.pack("<BQ", cmd, n) + data)
        try:
            hdr = rpc._recv_exact(self.s, 8, "size")
            return rpc._recv_exact(self.s, struct.unpack("<Q", hdr)[0], "response")
        except (HarnessError, OSError):
            return None

    def close(self):
        self.s.close()


def test_server_answers_from_the_op_alone_and_survives_malformed_requests(srv, ids, llama_tree):
    cmd = ids["cmd"]["SUPPORTS_OP"]
    ne = [256, 4, 1, 1]

    def cpy(dst, junk=False):
        return _request(0, _tensor(ids, dst, ne, "CPY", 1, junk),
                        [_tensor(ids, "F32", ne, tid=2, junk=junk), _tensor(ids, dst, ne, tid=3, junk=junk)])

    def mul_mat(b, junk=False):
        return _request(0, _tensor(ids, "F32", [64, 8, 1, 1], "MUL_MAT", 1, junk),
                        [_tensor(ids, "Q4_0", [256, 64, 1, 1], tid=2, junk=junk),
                         _tensor(ids, b, [256, 8, 1, 1], tid=3, junk=junk)])

    valid = {"cpy iq2_xxs": (cpy("IQ2_XXS"), 0), "cpy f16": (cpy("F16"), 1),
             "mul_mat q4_0 x f32": (mul_mat("F32"), 1), "mul_mat q4_0 x f16": (mul_mat("F16"), 0)}
    c = Raw(srv["port"])
    for what, (req, want) in valid.items():
        for junk in (False, True):
            got = c.ask(cmd, req if not junk else {"cpy iq2_xxs": cpy("IQ2_XXS", True), "cpy f16": cpy("F16", True),
                                                     "mul_mat q4_0 x f32": mul_mat("F32", True),
                                                     "mul_mat q4_0 x f16": mul_mat("F16", True)}[what])
            assert got == bytes([want]), f"{what} (junk fields: {junk}): {got!r}, expected {want}"
    c.close()
    assert c.version == rpc.header_version(llama_tree)

    f32 = _tensor(ids, "F32", ne, tid=2)
    malformed = {
        "type 200": _request(0, _tensor(ids, "F32", ne, "CPY", type_id=200), [f32]),
        "op 60000": _request(0, _tensor(ids, "F32", ne, op_id=60000), [f32]),
        "device 7": _request(7, _tensor(ids, "F32", ne, "CPY"), [f32]),
        "q4_0 row of 33": _request(0, _tensor(ids, "Q4_0", [33, 1, 1, 1], "CPY", nb=[18, 18, 18, 18]), [f32]),
        "a source of type 255": _request(0, _tensor(ids, "F32", ne, "CPY"),
                                         [_tensor(ids, "F32", ne, tid=2, type_id=255)]),
    }
    log = Log(srv["log"])
    for what, req in malformed.items():
        c = Raw(srv["port"])
        assert c.ask(cmd, req) is None, f"{what}: answered instead of refused"
        c.close()
    c = Raw(srv["port"])   # a short request: the size does not match, the server drops the connection
    assert c.ask(cmd, b"\0" * 100) is None
    c.close()
    assert _alive(srv), log.text()[-3000:]
    c = Raw(srv["port"])
    assert c.ask(cmd, cpy("F16")) == b"\x01"
    c.close()
    text = log.text()
    assert "invalid tensor type received: 200" in text and "invalid op received: 60000" in text, text[-3000:]


# ---------------------------------------------------------------------------------------------
# an older server


@pytest.mark.parametrize("older", [True, False], ids=["7.0.1 server", "7.1.0 server"])
def test_older_server_is_not_asked(bin_dir, ids, llama_tree, tmp_path, older):
    client = rpc.header_version(llama_tree)
    oldest = rpc.oldest_server_version(llama_tree)
    version = oldest if older else client
    assert older is (version[:2] < client[:2])
    cases = tmp_path / "cases.txt"
    cases.write_text(_cpy(ids, "IQ2_XXS", "cpy_iq2_xxs") + "\n")
    # one device; a 7.1 server answers SUPPORTS_OP with "no" (enough for `test-backend-ops support`)
    c = ids["cmd"]
    answers = {c["DEVICE_COUNT"]: struct.pack("<I", 1), c["GET_DEVICE_MEMORY"]: struct.pack("<QQ", 1 << 30, 1 << 30),
               c["GET_ALIGNMENT"]: struct.pack("<Q", 32), c["GET_MAX_SIZE"]: struct.pack("<Q", 1 << 40)}
    if version[1] >= 1:
        answers[c["SUPPORTS_OP"]] = b"\0"
    peer = RpcPeer(version, answers)
    try:
        p = _tbo(bin_dir, "support", "-b", "RPC0", "--rpc", f"127.0.0.1:{peer.port}", "--test-file", str(cases),
                 timeout=120)
        out = ANSI.sub("", p.stdout)
        print(out[-1500:], "commands:", peer.seen)
        assert p.returncode == 0, out[-3000:]
        res = _support(out)
        assert len(res) == 1, out[-3000:]
        warning = (f"is version {rpc.fmt_version(version)}, client {rpc.fmt_version(client)}: the server cannot "
                   f"say which ops")
        if older:
            # never sent the command it does not know (it would drop the connection); the old answer
            assert ids["cmd"]["SUPPORTS_OP"] not in peer.seen and list(res.values()) == [True]
            assert warning in out, out[-3000:]
        else:
            assert ids["cmd"]["SUPPORTS_OP"] in peer.seen and list(res.values()) == [False]
            assert "the server cannot say which ops" not in out
        assert peer.seen.count(rpc.RPC_CMD_HELLO) == 1, peer.seen
    finally:
        peer.close()
