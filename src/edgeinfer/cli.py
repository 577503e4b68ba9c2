"""``edgeinfer`` command line: ``edgeinfer serve --config config.yaml``, ``edgeinfer inspect MODEL.onnx``,
``edgeinfer optimize``, ``edgeinfer api-key`` and ``edgeinfer --version``.

The CLI declares only the handful of flags that override the config file; every other option lives in
the YAML (see ``config.py``). Exit codes: 0 normal stop, 1 a model failed to load, 2 bad configuration.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from edgeinfer import __version__

EXIT_CONFIG = 2  # also a model that cannot load: 1 (errors.startup_failure)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edgeinfer", description="A small, fast Open Inference Protocol server."
    )
    parser.add_argument("--version", action="version", version=f"edgeinfer {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = commands.add_parser(
        "serve",
        help="serve models over HTTP",
        description="Load every model, warm it up, and serve it. Flags override the config file.",
    )
    serve.add_argument("--config", metavar="PATH", help="YAML config file")
    serve.add_argument(
        "--model-repository", metavar="DIR", help="model repository (<model>/<version>/model.onnx)"
    )
    serve.add_argument("--host", help="address to listen on (default 0.0.0.0)")
    serve.add_argument("--http-port", type=int, metavar="PORT", help="HTTP port (default 8080)")
    serve.add_argument("--grpc-port", type=int, metavar="PORT", help="gRPC port (default 8081)")
    serve.add_argument("--no-grpc", action="store_true", help="serve no gRPC (grpcio is then never imported)")
    serve.add_argument(
        "--metrics-port", type=int, metavar="PORT", help="Prometheus metrics port (default 8082)"
    )
    serve.add_argument(
        "--workers",
        metavar="N",
        help="serving processes sharing the ports (default 1; 0 or auto: one per CPU)",
    )
    serve.add_argument(
        "--log-level",
        type=str.upper,
        choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
        help="default INFO",
    )
    inspect = commands.add_parser(
        "inspect",
        help="what an ONNX model is and where its nodes run",
        description="Inputs and outputs (with dynamic dimensions), size, opsets, operators, parameters, "
        "and for each execution provider the share of nodes and of time it runs and the operators that "
        "fall back to the CPU (from one profiled run of ONNX Runtime on zeros).",
    )
    inspect.add_argument("model", metavar="MODEL.onnx")
    inspect.add_argument(
        "--providers", metavar="P1,P2", help="providers to measure (default: every one this build has)"
    )
    inspect.add_argument("--json", action="store_true", help="print the report as JSON")
    optimize = commands.add_parser(
        "optimize",
        help="a graph-optimized, FP16 or INT8 model, written only if it still answers like the original",
        description="Graph optimization, then FP16 or INT8 if asked; the new model is compared with the "
        "original on samples and written only if its drop in agreement is within --max-drop (exit 1 "
        "otherwise). See docs/models.md.",
    )
    optimize.add_argument("model", metavar="MODEL.onnx")
    optimize.add_argument("-o", "--output", required=True, metavar="OUT.onnx")
    optimize.add_argument(
        "--level",
        choices=["disabled", "basic", "extended", "all"],
        default="extended",
        help="ONNX Runtime graph optimization, without --fp16/--int8 (default extended; all: a file for "
        "CPU boxes only)",
    )
    precision = optimize.add_mutually_exclusive_group()
    precision.add_argument("--fp16", action="store_true", help="convert weights and compute to FP16")
    precision.add_argument("--int8", choices=["dynamic", "static"], help="quantize to INT8")
    optimize.add_argument("--fp16-io", action="store_true", help="with --fp16: FP16 inputs and outputs too")
    optimize.add_argument(
        "--fp16-keep-tail",
        type=_count,
        default=0,
        metavar="N",
        help="with --fp16: the last N operators (the model's head) stay FP32, weights included",
    )
    optimize.add_argument("--calibration", metavar="DIR", help="--int8 static: sample requests")
    optimize.add_argument("--samples", metavar="DIR", help="sample requests to compare on (*.json, *.npz)")
    optimize.add_argument("--max-drop", type=float, default=0.01, help="largest agreement drop (0.01)")
    optimize.add_argument(
        "--tolerance",
        type=float,
        default=0.01,
        help="non-classifier outputs: a row agrees within this share of the output's range (0.01)",
    )
    commands.add_parser(
        "api-key",
        help="make a new API key and the line for a key file",
        description="Print a new random API key (give it to the client) and the key-file entry with its "
        "SHA-256 digest (keep that on the server: the key itself is not stored). See docs/security.md.",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "api-key":
        return api_key()
    if args.command == "inspect":
        return inspect_model(args)
    if args.command == "optimize":
        # lazy, as every command's own modules: `edgeinfer --version` and `--help` load none of them
        from edgeinfer.optimize import main as optimize_main

        return optimize_main(args)
    if args.command != "serve":
        parser.print_help()
        return EXIT_CONFIG
    return serve(args)


def api_key() -> int:
    # lazy: only this command needs it
    from edgeinfer.server.auth import new_key

    key, hex_digest = new_key()
    print(f"key (give it to the client, it is shown once): {key}")
    print("key file entry (set name and roles: infer, admin, metrics):")
    print(f"  - {{name: CHANGE-ME, sha256: {hex_digest}, roles: [infer]}}")
    return 0


def inspect_model(args: argparse.Namespace) -> int:
    import json
    import os

    # lazy: ONNX Runtime is loaded only when this command runs
    from edgeinfer.backends.onnxruntime import inspect_file

    if not os.path.isfile(args.model):
        print(f"edgeinfer inspect: no such file: {args.model}", file=sys.stderr)
        return EXIT_CONFIG
    providers = args.providers.split(",") if args.providers else None
    report = inspect_file(args.model, providers)
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(_inspect_text(report))
    return 0


def _inspect_text(report: dict) -> str:
    lines = [f"{report['path']}: {report['size_bytes'] / 1e6:.2f} MB"]
    if "opsets" in report:
        opsets = ", ".join(f"{domain} {version}" for domain, version in report["opsets"].items())
        lines.append(f"  opsets: {opsets}; parameters: {report['parameters']:,}")
        lines.append("  operators: " + ", ".join(f"{op} x{n}" for op, n in report["file_ops"].items()))
    for kind in ("inputs", "outputs"):
        for tensor in report.get(kind, []):
            shape = ", ".join(str(dim) for dim in tensor["shape"])
            lines.append(f"  {kind[:-1]:<6} {tensor['name']}: {tensor['type']} [{shape}]")
    for provider, measured in report["by_provider"].items():
        if "error" in measured:
            lines.append(f"  {provider}: {measured['error']}")
            continue
        lines.append(f"  {provider}: {measured['coverage']:.1%} of {measured['nodes']} nodes")
        lines.extend(
            f"    {share['provider']:<28} {share['nodes']:>5} nodes ({share['node_share']:.1%}), "
            f"{share['time_share']:.1%} of the time"
            for share in measured.get("providers", [])
        )
        for fallback, ops in measured.get("fallback_ops", {}).items():
            listed = ", ".join(f"{op} x{n}" for op, n in ops.items())
            lines.append(f"    falls back to {fallback}: {listed}")
    return "\n".join(lines)


def _count(value: str) -> int:
    """A whole number >= 0 (argparse makes the error a usage error, exit 2)."""
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"must be a whole number >= 0, not {value!r}")
    return int(value)


def _workers(value: str | None) -> int | str | None:
    """``--workers``: a number, or ``auto`` (validated with the config, so errors read the same)."""
    return int(value) if value is not None and value.lstrip("-").isdigit() else value


def _report_compiled() -> None:
    """Say whether the request path runs compiled (setup.py, ``native.py``): built without a C compiler
    or Python's headers it runs as Python, about a third slower per small request, and nothing else
    would tell. Warn when a checkout's compiled modules are older than their sources (they run the old
    code)."""
    from edgeinfer import native  # lazy: only when serving

    log = logging.getLogger("edgeinfer")
    compiled, stale = native.survey()
    if compiled:
        log.info("request path compiled (%d modules)", len(compiled))
    else:
        log.info("request path runs as Python: not compiled when installed (docs/deployment.md)")
    if stale:
        log.warning(
            "compiled modules older than their sources, running the old code: %s (rebuild them: make "
            "install, or build with EDGEINFER_COMPILE=0 to run the sources)",
            ", ".join(stale),
        )


def serve(args: argparse.Namespace) -> int:
    # lazy imports: `edgeinfer --version` and `--help` answer without loading the server
    from edgeinfer.app import Server
    from edgeinfer.config_file import load_config
    from edgeinfer.errors import ConfigError, ModelLoadError, startup_failure  # lazy
    from edgeinfer.logs import setup_logging  # lazy

    overrides = {
        "model_store_path": args.model_repository,
        "server.host": args.host,
        "server.http_port": args.http_port,
        "server.grpc_port": args.grpc_port,
        "server.metrics_port": args.metrics_port,
        "server.workers": _workers(args.workers),
        "logging.level": args.log_level,
    }
    overrides = {key: value for key, value in overrides.items() if value is not None}
    if args.no_grpc:
        overrides["server.grpc_port"] = None
    if args.config is None and args.model_repository is None:
        print("edgeinfer serve: give --config PATH and/or --model-repository DIR", file=sys.stderr)
        return EXIT_CONFIG
    try:
        config = load_config(args.config, overrides)
        setup_logging(config.logging.level, config.logging.format)
        _report_compiled()
        server = Server(config)
        server.run()
    except (ConfigError, ModelLoadError) as error:
        code, message = startup_failure(error)
        print(f"edgeinfer: {message}", file=sys.stderr)
        return code
    return 0
