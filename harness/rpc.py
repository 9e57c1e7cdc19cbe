"""Scale-out over ggml-rpc: rpc-server control, endpoint checks and a layer-split planner.

ggml-rpc is unauthenticated: anyone who reaches an rpc-server's port can allocate memory on it and
run graphs. Every command here binds and connects to 127.0.0.1 unless an address is given.

    stq-metal rpc-server start|stop|status [--backend cpu] [--port 50052] [--host 127.0.0.1]
    stq-metal serve start --rpc HOST:PORT[,HOST:PORT] -- -ngl 99 --tensor-split A,B
    stq-metal rpc plan MODEL.gguf --host macA=192 --host macB=128@10.0.0.2 [--ctx 32768]

The wire protocol (llama.cpp's ggml/src/ggml-rpc): a request is | cmd u8 | size u64 | data |, a
response | size u64 | data |, little endian. The first command of a connection is HELLO (14) with
24 bytes of transport capabilities; the answer is major, minor, patch, one pad byte and 24 bytes of
capabilities. An rpc-server serves one client connection at a time.
"""

from __future__ import annotations

import json
import re
import socket
import struct
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import config, server
from .util import HarnessError, atomic_write_bytes, say

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 50052
EXE = "ggml-rpc-server"

RPC_CMD_HELLO = 14
RPC_CONN_CAPS_SIZE = 24
HELLO_RSP_SIZE = 4 + RPC_CONN_CAPS_SIZE

GiB = 1 << 30


# ---------------------------------------------------------------------------------------------
# protocol version: the header of the applied tree is the one source of truth


def header_version(tree: Path | None = None) -> tuple[int, int, int]:
    """RPC_PROTO_{MAJOR,MINOR,PATCH}_VERSION of ggml-rpc.h in the applied llama.cpp tree."""
    h = Path(tree or config.default_tree()) / "ggml" / "include" / "ggml-rpc.h"
    try:
        text = h.read_text()
    except OSError as e:
        raise HarnessError(f"cannot read {h} (apply the series first: python harness/build.py --apply): {e}")
    out = []
    for part in ("MAJOR", "MINOR", "PATCH"):
        m = re.search(rf"#define\s+RPC_PROTO_{part}_VERSION\s+(\d+)", text)
        if not m:
            raise HarnessError(f"{h}: no RPC_PROTO_{part}_VERSION define")
        out.append(int(m.group(1)))
    return out[0], out[1], out[2]


def oldest_server_version(tree: Path | None = None) -> tuple[int, int, int]:
    """The oldest server a client of the applied tree accepts (patch 0065's RPC_PROTO_MIN_SERVER_{MINOR,PATCH}_VERSION,
    same major): one that knows every tensor type and op of the client."""
    h = Path(tree or config.default_tree()) / "ggml" / "include" / "ggml-rpc.h"
    text = h.read_text()
    out = []
    for part in ("MINOR", "PATCH"):
        m = re.search(rf"#define\s+RPC_PROTO_MIN_SERVER_{part}_VERSION\s+(\d+)", text)
        if not m:
            raise HarnessError(f"{h}: no RPC_PROTO_MIN_SERVER_{part}_VERSION define (apply the series: python "
                               f"harness/build.py --apply)")
        out.append(int(m.group(1)))
    return header_version(tree)[0], out[0], out[1]


def fmt_version(v: tuple[int, int, int]) -> str:
    return ".".join(str(x) for x in v)


def _recv_exact(sock: socket.socket, n: int, what: str) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise HarnessError(f"connection closed after {len(buf)} of {n} bytes of {what}")
        buf += chunk
    return buf


def hello(host: str, port: int, timeout: float = 3.0) -> tuple[int, int, int]:
    """HELLO handshake with an rpc-server; returns its protocol version. Bounded by `timeout`
    (an rpc-server busy with another client does not answer until that client disconnects)."""
    where = f"rpc-server {host}:{port}"
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            # on a timeout the connection is still queued at a busy server, our HELLO in it: close with a
            # reset, so that the server does not answer it later into a closed socket (SIGPIPE kills an
            # rpc-server without patch 0063)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.settimeout(timeout)
            s.sendall(struct.pack("<BQ", RPC_CMD_HELLO, RPC_CONN_CAPS_SIZE) + bytes(RPC_CONN_CAPS_SIZE))
            size = struct.unpack("<Q", _recv_exact(s, 8, "the HELLO response size"))[0]
            if size != HELLO_RSP_SIZE:
                raise HarnessError(f"{where}: HELLO response of {size} bytes, expected {HELLO_RSP_SIZE}: "
                                   f"not an rpc-server of protocol 3 or later")
            rsp = _recv_exact(s, size, "the HELLO response")
    except socket.timeout:
        raise HarnessError(f"{where}: no HELLO answer within {timeout:.0f} s (busy with another client, "
                           f"or not an rpc-server)") from None
    except OSError as e:
        raise HarnessError(f"{where}: cannot connect: {e}") from None
    except HarnessError as e:
        raise HarnessError(f"{where}: {e}") from None
    return rsp[0], rsp[1], rsp[2]


def parse_endpoints(spec: str) -> list[tuple[str, int]]:
    """'host:port[,host:port]' -> [(host, port)], with an error naming the bad item."""
    out = []
    for item in spec.split(","):
        item = item.strip()
        m = re.fullmatch(r"([^:\s]+):(\d{1,5})", item)
        if not m or not 0 < int(m.group(2)) < 65536:
            raise HarnessError(f"bad rpc endpoint {item!r} in {spec!r}: expected HOST:PORT[,HOST:PORT...]")
        out.append((m.group(1), int(m.group(2))))
    if not out:
        raise HarnessError("no rpc endpoint given")
    return out


def compatible(client: tuple[int, int, int], srv: tuple[int, int, int],
               oldest: tuple[int, int, int]) -> str | None:
    """None when a client of version `client` accepts a server of version `srv` (the rule of
    negotiate_hello, patches 0060 and 0065; `oldest` from oldest_server_version), else the reason it
    refuses."""
    if srv[0] != client[0]:
        return "the major versions differ"
    if srv[1] > client[1]:
        return "the server is newer, update the client"
    if srv[1:] < oldest[1:]:
        return "the server is older and may not know every tensor type or op of this client, update the server"
    return None


def check_endpoints(spec: str, client: tuple[int, int, int] | None = None, timeout: float = 5.0,
                    oldest: tuple[int, int, int] | None = None) -> None:
    """Before starting llama-server with --rpc: every endpoint answers HELLO with a version this build
    accepts. Fails early, naming the endpoint and both versions. An older server that is still accepted
    gets a warning: before 7.1 a server cannot say which ops its backend supports (patch 0065), so the
    client assumes it supports every op, as upstream did, and an op it lacks aborts it."""
    client = client or header_version()
    oldest = oldest or oldest_server_version()
    for host, port in parse_endpoints(spec):
        v = hello(host, port, timeout)
        why = compatible(client, v, oldest)
        if why:
            raise HarnessError(f"rpc-server {host}:{port} speaks protocol {fmt_version(v)}, this build "
                               f"{fmt_version(client)}: {why}")
        if v[:2] < client[:2]:
            say(f"WARNING: rpc-server {host}:{port} speaks protocol {fmt_version(v)}, this build "
                f"{fmt_version(client)}: accepted, but an older server may not answer which ops its backend "
                f"supports (7.1 does), and then every op is assumed supported; update the server")


# ---------------------------------------------------------------------------------------------
# builds: the rpc-server and an rpc-capable llama-server for a backend


def build_with_rpc(backend: str, targets: tuple[str, ...] = ("llama-server", EXE)) -> Path:
    """A build of `backend` with ggml-rpc (its default build where that already has -DGGML_RPC=ON,
    as cpu does; otherwise the same options plus -DGGML_RPC=ON, in its own keyed build folder)."""
    from . import build as buildmod
    extra = [] if "-DGGML_RPC=ON" in buildmod.backend_flags(backend) else ["-DGGML_RPC=ON"]
    return buildmod.ensure_build(backend, targets, extra=extra)


def build_command(backend: str) -> str:
    from . import build as buildmod
    extra = "" if "-DGGML_RPC=ON" in buildmod.backend_flags(backend) else " --cmake-arg -DGGML_RPC=ON"
    return (f"python harness/build.py --build --backend {backend}{extra} "
            f"--target llama-server --target {EXE}")


# ---------------------------------------------------------------------------------------------
# rpc-server processes (pid + log files in the cache's run/, like harness.server's llama-server)


def instance_name(port: int) -> str:
    return f"rpc-{port}"


def status(name: str) -> dict | None:
    """The pid-file record of a running rpc-server (with `version` or `probe_error`), or None.
    Removes a stale pid file."""
    pf = server.pid_file(name)
    if not pf.exists():
        return None
    info = json.loads(pf.read_text())
    if not server._alive(info["pid"], EXE.encode()):
        pf.unlink(missing_ok=True)
        return None
    probe = "127.0.0.1" if info["host"] in ("0.0.0.0", "::") else info["host"]
    try:
        info["version"] = fmt_version(hello(probe, info["port"], timeout=2.0))
    except HarnessError as e:
        info["probe_error"] = str(e)
    return info


def running_names() -> list[str]:
    d = config.run_dir()
    return sorted(p.stem for p in d.glob("rpc-*.json")) if d.is_dir() else []


def start(binary: Path, port: int = DEFAULT_PORT, host: str = DEFAULT_HOST, threads: int | None = None,
          devices: str | None = None, cache: bool = False, name: str | None = None,
          timeout: float = 60.0, env: dict[str, str] | None = None) -> dict:
    """Start one rpc-server; returns its record once it answers HELLO."""
    import os
    binary = Path(binary)
    name = name or instance_name(port)
    if not binary.exists():
        raise HarnessError(f"{EXE} binary not found: {binary} (build it: {build_command('cpu')})")
    cur = status(name)
    if cur:
        raise HarnessError(f"rpc-server '{name}' is already running (pid {cur['pid']}, {cur['host']}:{cur['port']}, "
                           f"log {cur['log']}); stop it first: stq-metal rpc-server stop --port {cur['port']}")
    if server.port_busy(port, host):
        raise HarnessError(f"port {port} on {host} is already in use; refusing to start an rpc-server there "
                           f"(choose another with --port)")
    config.run_dir().mkdir(parents=True, exist_ok=True)
    log = config.run_dir() / f"{name}.log"
    cmd = [str(binary), "--host", host, "--port", str(port)]
    if threads:
        cmd += ["--threads", str(threads)]
    if devices:
        cmd += ["--device", devices]
    if cache:
        cmd += ["--cache"]
    penv = {**os.environ, **(env or {})}
    with open(log, "w") as lf:
        lf.write("$ " + " ".join(cmd) + "\n")
        lf.flush()
        proc = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=penv)
    info = {"pid": proc.pid, "port": port, "host": host, "log": str(log), "cmd": cmd, "started": time.time()}
    atomic_write_bytes(server.pid_file(name), json.dumps(info, indent=1).encode())
    if host not in ("127.0.0.1", "localhost", "::1"):
        say(f"WARNING: rpc-server bound to {host}: ggml-rpc is unauthenticated; keep this port on a trusted "
            f"network only")
    probe = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    t0 = time.time()
    last = ""
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            server.pid_file(name).unlink(missing_ok=True)
            raise HarnessError(f"rpc-server exited with code {proc.returncode} during startup.\n"
                               f"--- {log} (tail) ---\n{server._log_tail(log)}")
        try:
            info["version"] = fmt_version(hello(probe, port, timeout=2.0))
            atomic_write_bytes(server.pid_file(name), json.dumps(info, indent=1).encode())
            say(f"rpc-server {name} up (pid {proc.pid}, {host}:{port}, protocol {info['version']}, log {log})")
            return info
        except HarnessError as e:
            last = str(e)
        time.sleep(0.2)
    server._terminate(proc.pid)
    server.pid_file(name).unlink(missing_ok=True)
    raise HarnessError(f"rpc-server did not answer HELLO within {timeout:.0f} s ({last}); stopped it.\n"
                       f"--- {log} ---\n{server._log_tail(log)}")


def stop(name: str) -> bool:
    info = status(name)
    if not info:
        server.pid_file(name).unlink(missing_ok=True)
        return False
    server._terminate(info["pid"])
    server.pid_file(name).unlink(missing_ok=True)
    say(f"rpc-server {name} (pid {info['pid']}, {info['host']}:{info['port']}) stopped")
    return True


# ---------------------------------------------------------------------------------------------
# split planner


@dataclass
class HostSpec:
    name: str
    mem: float      # GiB the host can give to the model (weights + KV + compute buffers)
    addr: str       # where the others reach it
    port: int = DEFAULT_PORT


def parse_host(spec: str) -> HostSpec:
    """NAME=MEM_GIB[@ADDR[:PORT]]"""
    m = re.fullmatch(r"([A-Za-z0-9_.-]+)=([0-9.]+)(?:@([^:@\s]+)(?::(\d+))?)?", spec)
    if not m:
        raise HarnessError(f"bad --host {spec!r}: expected NAME=MEM_GIB[@ADDR[:PORT]], e.g. macB=128@10.0.0.2")
    mem = float(m.group(2))
    if mem <= 0:
        raise HarnessError(f"--host {spec!r}: memory must be positive")
    return HostSpec(m.group(1), mem, m.group(3) or m.group(1), int(m.group(4) or DEFAULT_PORT))


_BLK = re.compile(r"^blk\.(\d+)\.")
OUTPUT_TENSORS = ("output.weight", "output_norm.weight", "output_norm.bias", "output.bias")


@dataclass
class ModelSizes:
    arch: str
    n_layer: int
    layer_bytes: list[int]          # weights of each repeating layer
    layer_active_bytes: list[int]   # read per token (dense + n_expert_used/n_expert of the experts)
    input_bytes: int                # token embedding etc.: stays on the main host's CPU
    output_bytes: int               # output head + norm: with the last device
    kv_bytes_per_token_layer: int   # f16 K + V of one layer for one token (estimate)
    kv_note: str
    n_embd: int
    ctx_train: int


def model_sizes(path: Path, kv_override: int | None = None) -> ModelSizes:
    from . import gguf_layout
    lay = gguf_layout.read_layout(path)
    kv = lay.kv
    arch = kv.get("general.architecture")
    if not arch:
        raise HarnessError(f"{path}: no general.architecture key")

    def key(k, default=None):
        return kv.get(f"{arch}.{k}", default)

    n_layer = key("block_count")
    if not n_layer:
        raise HarnessError(f"{path}: no {arch}.block_count key")
    n_layer = int(n_layer)
    ext = lay.extents()
    n_expert = int(key("expert_count", 0) or 0)
    n_used = int(key("expert_used_count", 0) or 0)
    layer = [0] * n_layer
    active = [0] * n_layer
    inp = out = 0
    for t in lay.tensors:
        size = ext[t.name]
        m = _BLK.match(t.name)
        if m:
            il = int(m.group(1))
            if il >= n_layer:  # e.g. an MTP/nextn block stored after the decoder: kept with the output
                out += size
                continue
            layer[il] += size
            frac = n_used / n_expert if ("_exps." in t.name and n_expert) else 1.0
            active[il] += int(size * frac)
        elif t.name in OUTPUT_TENSORS:
            out += size
        else:
            inp += size
    if "output.weight" not in {t.name for t in lay.tensors}:
        # tied embeddings: the output layer multiplies by token_embd; llama.cpp duplicates it on the
        # output device
        emb = next((t for t in lay.tensors if t.name == "token_embd.weight"), None)
        if emb is not None:
            out += ext[emb.name]
    n_embd = int(key("embedding_length", 0) or 0)
    if kv_override is not None:
        kvb, note = kv_override, "given with --kv-per-token"
    elif key("attention.kv_lora_rank"):
        rank = int(key("attention.kv_lora_rank"))
        rope = int(key("rope.dimension_count", 0) or 0)
        kvb = (rank + rope) * 2
        note = f"MLA: (kv_lora_rank {rank} + rope {rope}) x f16; indexer caches not included"
    else:
        n_head = int(key("attention.head_count", 0) or 0)
        n_head_kv = key("attention.head_count_kv", n_head)
        if hasattr(n_head_kv, "__len__"):  # per-layer array
            n_head_kv = max(int(x) for x in n_head_kv)
        n_head_kv = int(n_head_kv or 0)
        k_len = int(key("attention.key_length", 0) or (n_embd // n_head if n_head else 0))
        v_len = int(key("attention.value_length", 0) or k_len)
        kvb = n_head_kv * (k_len + v_len) * 2
        note = f"{n_head_kv} kv heads x (K {k_len} + V {v_len}) x f16"
        if key("attention.sliding_window"):
            note += "; counted at full context for every layer (sliding-window layers use less: upper bound)"
    return ModelSizes(arch, n_layer, layer, active, inp, out, kvb, note, n_embd,
                      int(key("context_length", 0) or 0))


@dataclass
class Placement:
    host: HostSpec
    role: str                 # "rpc-server" or "main"
    device: str               # llama.cpp device name on the main host (RPC0, ..., or the local GPU)
    layers: range
    weight_bytes: int
    kv_bytes: int
    extra_bytes: int          # input layer (main host) / output layer (last device)
    active_bytes: int         # weights read per generated token
    budget_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes + self.extra_bytes


@dataclass
class Plan:
    model: Path
    sizes: ModelSizes
    ctx: int
    placements: list[Placement] = field(default_factory=list)
    main_device: bool = True

    def tensor_split(self) -> list[int]:
        """Layer counts per device in llama.cpp's device order; the output layer counts as one more
        layer on the last device (llama.cpp splits n_layer + 1 layers when every layer is offloaded)."""
        counts = [len(p.layers) for p in self.placements if p.device]
        counts[-1] += 1
        return counts


def plan(model: Path, hosts: list[HostSpec], main: str | None = None, ctx: int = 4096,
         reserve_gib: float = 2.0, main_device: bool = True, kv_override: int | None = None) -> Plan:
    """Split the repeating layers over the hosts, contiguously, in llama.cpp's device order (rpc-servers
    in --rpc order first, then the main host's own GPU), in proportion to each host's budget
    (memory - reserve; the main host's budget also pays for the input layer kept on its CPU)."""
    if not hosts:
        raise HarnessError("give at least one --host NAME=MEM_GIB")
    names = [h.name for h in hosts]
    if len(set(names)) != len(names):
        raise HarnessError(f"duplicate host names in {names}")
    main = main or hosts[0].name
    if main not in names:
        raise HarnessError(f"--main {main!r} is not one of the hosts {names}")
    sizes = model_sizes(Path(model), kv_override)
    kv_layer = sizes.kv_bytes_per_token_layer * ctx
    remotes = [h for h in hosts if h.name != main]
    main_h = next(h for h in hosts if h.name == main)
    order = remotes + ([main_h] if main_device else [])
    if not order:
        raise HarnessError("no device to hold the layers: a single host without its own GPU (--main-cpu-only) "
                           "needs no rpc")
    budgets = []
    for h in order:
        b = h.mem * GiB - reserve_gib * GiB - (sizes.input_bytes if h is main_h else 0)
        if h is order[-1]:
            b -= sizes.output_bytes
        budgets.append(b)
    for h, b in zip(order, budgets):
        if b < 0:
            fixed = [n for n, v in (("the input layer", h is main_h), ("the output layer", h is order[-1])) if v]
            raise HarnessError(f"host {h.name}: {' and '.join(fixed)} alone need more than its {h.mem} GiB minus "
                               f"the {reserve_gib} GiB reserve (input {sizes.input_bytes / GiB:.2f} GiB, output "
                               f"{sizes.output_bytes / GiB:.2f} GiB)")
    if not main_device:  # the main host holds only the input layer on its CPU
        if main_h.mem * GiB - reserve_gib * GiB < sizes.input_bytes:
            raise HarnessError(f"main host {main}: {main_h.mem} GiB cannot hold the input layer "
                               f"({sizes.input_bytes / GiB:.2f} GiB) plus the {reserve_gib} GiB reserve")
    need = [lb + kv_layer for lb in sizes.layer_bytes]
    total_need, total_budget = sum(need), sum(max(b, 0) for b in budgets)
    if total_need > total_budget:
        raise HarnessError(f"{Path(model).name} needs {total_need / GiB:.1f} GiB for its {sizes.n_layer} layers "
                           f"(weights + KV at -c {ctx}) but the hosts offer {total_budget / GiB:.1f} GiB after "
                           f"the reserve and the input/output layers: add a host, more memory, or a smaller -c")
    # contiguous cut points: device d gets layers while the running sum stays under its share
    cuts, acc, il = [], 0, 0
    target = 0.0
    for d, b in enumerate(budgets):
        if d == len(budgets) - 1:
            cuts.append(sizes.n_layer)
            break
        target += max(b, 0) / total_budget * total_need
        while il < sizes.n_layer and acc + need[il] <= target + 0.5 * need[il]:
            acc += need[il]
            il += 1
        cuts.append(il)
    out = Plan(Path(model), sizes, ctx, main_device=main_device)
    start = 0
    for d, h in enumerate(order):
        rng = range(start, cuts[d])
        start = cuts[d]
        w = sum(sizes.layer_bytes[i] for i in rng)
        a = sum(sizes.layer_active_bytes[i] for i in rng)
        extra = (sizes.input_bytes if h is main_h else 0) + (sizes.output_bytes if d == len(order) - 1 else 0)
        dev = f"RPC{d}" if h is not main_h else "local GPU (MTL0 / CUDA0)"
        out.placements.append(Placement(h, "main" if h is main_h else "rpc-server", dev, rng, w,
                                        kv_layer * len(rng), extra, a, int(budgets[d] + extra)))
    if not main_device:
        out.placements.append(Placement(main_h, "main", "", range(0), 0, 0, sizes.input_bytes, 0,
                                        int(main_h.mem * GiB - reserve_gib * GiB)))
    for p in out.placements:  # rounding to whole layers can push a host over its budget
        if p.total_bytes > p.host.mem * GiB - reserve_gib * GiB:
            what = f"layers {p.layers.start}..{p.layers.stop - 1}" if p.layers else "its share"
            raise HarnessError(f"host {p.host.name}: {what} need "
                               f"{p.total_bytes / GiB:.1f} GiB, more than its {p.host.mem} GiB minus the "
                               f"{reserve_gib} GiB reserve")
    return out


def render(pl: Plan, backend: str = "metal", model_path: str | None = None, http_port: int = 8080) -> str:
    """The plan as a table plus the exact commands for each machine."""
    s = pl.sizes
    lines = [f"model {pl.model.name}: arch {s.arch}, {s.n_layer} layers, "
             f"weights {(sum(s.layer_bytes) + s.input_bytes + s.output_bytes) / GiB:.2f} GiB "
             f"(layers {sum(s.layer_bytes) / GiB:.2f}, input {s.input_bytes / GiB:.2f}, "
             f"output {s.output_bytes / GiB:.2f}); KV {s.kv_bytes_per_token_layer} B per token per layer "
             f"({s.kv_note}); -c {pl.ctx}",
             "",
             f"{'host':10s} {'role':10s} {'device':10s} {'layers':>9s} {'weights':>9s} {'KV':>7s} {'in/out':>7s} "
             f"{'total':>8s} {'of':>6s} {'read/token':>10s}"]
    for p in pl.placements:
        lay = f"{p.layers.start}-{p.layers.stop - 1}" if p.layers else "-"
        lines.append(f"{p.host.name:10s} {p.role:10s} {(p.device.split()[0] if p.device else 'CPU'):10s} {lay:>9s} "
                     f"{p.weight_bytes / GiB:8.2f}G {p.kv_bytes / GiB:6.2f}G {p.extra_bytes / GiB:6.2f}G "
                     f"{p.total_bytes / GiB:7.2f}G {p.host.mem:5.1f}G {p.active_bytes / GiB:9.3f}G")
    lines.append("(GiB; 'of' is the memory given with --host; read/token = weights read per generated token, "
                 "experts at expert_used/expert_count; the output head is read on the last device)")
    model_arg = model_path or str(pl.model)
    remotes = [p for p in pl.placements if p.role == "rpc-server"]
    main = next(p for p in pl.placements if p.role == "main")
    lines += ["", "# every machine: the same checkout of this repository (same patch series, same protocol)"]
    for p in remotes:
        lines += ["", f"# on {p.host.name}: build, then serve its device on the trusted network only "
                      f"(ggml-rpc is unauthenticated)",
                  build_command(backend),
                  f"stq-metal rpc-server start --backend {backend} --host {p.host.addr} --port {p.host.port}"]
    rpc_arg = ",".join(f"{p.host.addr}:{p.host.port}" for p in remotes)
    split = ",".join(str(c) for c in pl.tensor_split())
    srv_args = f"-ngl 999 --tensor-split {split} -c {pl.ctx}"
    lines += ["", f"# on {main.host.name} (main): llama-server with the rpc devices first, then its own GPU",
              build_command(backend),
              f"./RUNBOOK.sh start --backend {backend} --model {model_arg} --port {http_port} "
              f"--rpc {rpc_arg} -- {srv_args}"]
    if not pl.main_device:
        lines.append("# (planned with --main-cpu-only: a GPU on the main host would join the split as the last "
                     "device; restrict llama-server to the rpc devices with --device RPC0,... if it has one)")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# command line (stq-metal rpc-server ..., stq-metal rpc plan ...)


def _server_binary(backend: str) -> Path:
    return build_with_rpc(backend, (EXE,)) / "bin" / EXE


def cmd_rpc_server(args) -> int:
    names = [args.name] if args.name else ([instance_name(args.port)] if args.port else running_names())
    if args.action == "status":
        infos = [i for i in (status(n) for n in names) if i]
        if not infos:
            print("not running")
            return 3
        for i in infos:
            state = f"protocol {i['version']}" if "version" in i else f"not answering HELLO ({i['probe_error']})"
            print(f"running: pid {i['pid']} {i['host']}:{i['port']} {state} log {i['log']}")
        return 0
    if args.action == "stop":
        if not any([stop(n) for n in names]):
            print("not running")
        return 0
    binary = Path(args.binary) if args.binary else _server_binary(args.backend)
    port = args.port or DEFAULT_PORT
    info = start(binary, port, args.host, args.threads, args.device, args.cache, name=args.name)
    print(f"{info['host']}:{info['port']}  (pid {info['pid']}, protocol {info['version']}, log {info['log']})")
    return 0


def cmd_rpc(args) -> int:
    if args.action == "plan" and not args.model:
        raise HarnessError("rpc plan needs MODEL.gguf")
    if args.action == "check" and not args.endpoints:
        raise HarnessError("rpc check needs --endpoints HOST:PORT[,...]")
    if args.action == "plan":
        hosts = [parse_host(h) for h in args.host]
        pl = plan(Path(args.model), hosts, args.main, args.ctx, args.reserve, not args.main_cpu_only,
                  args.kv_per_token)
        print(render(pl, args.backend))
        return 0
    if args.action == "check":
        client = header_version()
        check_endpoints(args.endpoints, client)
        print(f"ok: {args.endpoints} accept protocol {fmt_version(client)}")
        return 0
    raise HarnessError(f"unknown rpc action {args.action}")


def add_parsers(sub) -> None:
    """Register `rpc-server` and `rpc` on the stq-metal subparsers."""
    from . import build as buildmod
    p = sub.add_parser("rpc-server", help="start / stop / status of ggml-rpc servers (pid + log in the cache)",
                       description="ggml-rpc servers expose this machine's device to a llama-server elsewhere. "
                                   "ggml-rpc is unauthenticated: the default bind address is 127.0.0.1; bind "
                                   "another address only on a trusted network.")
    p.add_argument("action", choices=["start", "stop", "status"])
    p.add_argument("--backend", default=buildmod.default_backend(), choices=buildmod.BACKENDS,
                   help="which build's rpc-server to use (built with -DGGML_RPC=ON if needed)")
    p.add_argument("--port", type=int, default=None,
                   help=f"port (start: default {DEFAULT_PORT}; stop/status: this instance; default all)")
    p.add_argument("--host", default=DEFAULT_HOST,
                   help="address to bind (default 127.0.0.1; anything else exposes an unauthenticated service)")
    p.add_argument("--threads", type=int, help="CPU threads of the server's CPU device")
    p.add_argument("--device", help="comma-separated devices to expose (default: all accelerators, else CPU)")
    p.add_argument("--cache", action="store_true", help="let the server cache large tensors on its disk (-c)")
    p.add_argument("--binary", help=f"use this {EXE} binary instead of building one")
    p.add_argument("--name", help="instance name for the pid/log files (default rpc-PORT)")
    p.set_defaults(func=cmd_rpc_server)

    p = sub.add_parser("rpc", help="plan a layer split over rpc hosts; check rpc endpoints",
                       description="`plan`: split a GGUF's layers over machines by their memory and print the "
                                   "commands for each. `check`: HELLO every endpoint and compare protocol versions.")
    p.add_argument("action", choices=["plan", "check"])
    p.add_argument("model", nargs="?", help="plan: the GGUF to split")
    p.add_argument("--host", action="append", default=[], metavar="NAME=MEM_GIB[@ADDR[:PORT]]",
                   help="plan: a machine and the memory (GiB) it can give the model; repeat per machine, "
                        "in the order of --rpc (the main host may be anywhere)")
    p.add_argument("--main", help="plan: the host that runs llama-server (default: the first --host)")
    p.add_argument("--main-cpu-only", action="store_true",
                   help="plan: the main host has no GPU of its own; all layers go to the rpc hosts")
    p.add_argument("--ctx", type=int, default=4096, help="plan: context size for the KV cache (default 4096)")
    p.add_argument("--reserve", type=float, default=2.0,
                   help="plan: GiB kept free per host for compute buffers and the OS (default 2)")
    p.add_argument("--kv-per-token", type=int, default=None,
                   help="plan: KV bytes per token per layer, overriding the estimate from the GGUF keys")
    p.add_argument("--backend", default="metal", choices=buildmod.BACKENDS,
                   help="plan: backend of the printed build and server commands (default metal)")
    p.add_argument("--endpoints", help="check: HOST:PORT[,HOST:PORT]")
    p.set_defaults(func=cmd_rpc)
