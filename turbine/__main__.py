"""``python -m turbine``: ``demo`` runs the README example; ``info`` prints versions, devices and the
kernel cache; ``cache info|list|clear`` looks after the on-disk kernel cache; ``coverage`` runs the
OpInfo operator coverage suite and writes its report; ``explain <op>`` says what turbine does with an op and why."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys
import time
from pathlib import Path

import iree.runtime as rt
import torch

import turbine
from turbine.config import config
from turbine.eager.explain import explain, resolve
from turbine.kernels_cache.bundles import building as bundle_jobs
from turbine.kernels_cache import DiskStore, compiler_version


def demo(device: str) -> int:
    """The README's example on one device, checked against torch on the CPU."""
    torch.manual_seed(0)
    x = torch.randn(64, 128, device=device)
    w = torch.randn(128, 32, device=device)
    y = torch.relu(x @ w + 1.0)
    v, i = torch.max(y, dim=1)
    print(y.device, v.cpu()[:4], i.dtype)
    expected = torch.relu(x.cpu() @ w.cpu() + 1.0).max(dim=1)
    torch.testing.assert_close(v.cpu(), expected.values, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(i.cpu(), expected.indices)
    print(f"matches torch on the CPU; {turbine.stats()['kernels_compiled']} kernels compiled")
    return 0


def info() -> int:
    for package in ("turbine-eager", "torch", "iree-base-compiler", "iree-base-runtime"):
        try:
            version = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            version = "not installed" if package != "turbine-eager" else turbine.__version__ + " (source tree)"
        print(f"{package:20} {version}")
    print(f"{'IREE compiler':20} {compiler_version()}")

    print(f"{'IREE drivers':20} {', '.join(rt.query_available_drivers())}")
    print(f"{'turbine devices':20} {', '.join(turbine.devices())}")
    print(f"{'kernel cache':20} {turbine.config.cache_dir if turbine.config.cache_enabled else 'off (TURBINE_CACHE=0)'}")
    return 0


def _open_store(path: str | None):
    """The cache directory to inspect, or an error message naming the problem and the way out."""
    root = Path(path or config.cache_dir)
    if not root.is_dir():
        return None, f"no turbine kernel cache at {root} (nothing compiled yet, or TURBINE_CACHE_DIR points elsewhere)"
    if not os.access(root, os.R_OK | os.X_OK):
        return None, f"the turbine kernel cache at {root} cannot be read (check its permissions)"
    return DiskStore(root, config.cache_max_bytes), None


def _age(timestamp: float) -> str:
    seconds = max(0, time.time() - timestamp)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def cache(args: argparse.Namespace) -> int:
    store, error = _open_store(args.dir)
    if error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.action == "info":
        entries = list(store.entries())
        size, bundles = store.usage()
        print(f"{'directory':10} {store.root}")
        print(
            f"{'entries':10} {len(entries)} kernels, {bundles} bundles, {len(store.failures())} failed signatures, "
            f"{len(store.choices())} executor choices"
        )
        print(f"{'bytes':10} {size} (limit {store.max_bytes}; kernels, their sources and bundles)")
        plans = store.plan_files()
        print(f"{'plans':10} {len(plans)} files, {sum(size for _, size in plans)} bytes (plans kept per device)")
        jobs = bundle_jobs(store.root)
        active = [job for job in jobs if job["active"]]
        described = "; ".join(
            f"{job['kernels']} kernels, queued {job['age']:.0f}s ago" + (" (building now)" if job["active"] else "") for job in jobs
        )
        print(f"{'building':10} {len(active)} bundle{'s' if len(active) != 1 else ''} now, {len(jobs) - len(active)} queued" + (f": {described}" if jobs else ""))
    elif args.action == "list":
        entries = sorted(store.entries(), key=lambda e: -e["last_used"])
        if args.op:
            entries = [e for e in entries if args.op in e["op"]]
        print(f"{'bytes':>8}  {'last used':>9}  {'compile s':>9}  op and signature")
        for entry in entries:
            seconds = entry["record"].get("compile_seconds", "?")
            print(f"{entry['bytes']:>8}  {_age(entry['last_used']):>9}  {seconds:>9}  {entry['op']}")
        for choice in store.choices():
            if args.op and args.op not in choice.get("op", ""):
                continue
            if "dims" in choice:  # a family of signatures and its dynamic dims (eager/dynamic.py)
                dims = ", ".join(f"input {i} dim {d}" for i, d in choice["dims"]) or "none"
                state = "refused (a kernel per size)" if choice.get("refused") else f"dynamic: {dims}"
                print(f"{'shapes':>8}  {'':>9}  {'':>9}  {choice.get('op', '?')}: {state}")
            elif "served" in choice:  # a call with a size of 1 at a dynamic dim (eager/op_trace.py)
                state = "runs on the dynamic kernel" if choice["served"] else "has its own kernel (another program at 1)"
                print(f"{'shapes':>8}  {'':>9}  {'':>9}  {choice.get('op', '?')}: {state}")
            elif "state" in choice:  # a view gather, view write or factory kind gone generic
                state = "one kernel for any size" if choice["state"] == "generic" else "refused (a kernel per size)"
                print(f"{'shapes':>8}  {'':>9}  {'':>9}  {choice.get('op', '?')}: {state}")
            else:
                times = ", ".join(f"{name} {us} us" for name, us in (choice.get("us") or {}).items())
                print(f"{'chosen':>8}  {'':>9}  {'':>9}  {choice.get('op', '?')}: {choice.get('executor', '?')} ({choice.get('why', '')}{'; ' + times if times else ''})")
        for failure in store.failures():
            if not args.op or args.op in failure.get("op", ""):
                print(f"{'failed':>8}  {'':>9}  {'':>9}  {failure.get('op', '?')}: {failure.get('error', '').splitlines()[0][:120]}")
    else:
        if args.op:  # refuse rather than clear everything the user meant to keep
            print("turbine: --op filters `cache list`; `cache clear` removes all entries, or the failed ones with --failed", file=sys.stderr)
            return 2
        count = store.clear(failed_only=args.failed)
        print(f"removed {count} {'failed signatures' if args.failed else 'entries'} from {store.root}")
    return 0


def coverage(argv: list[str]) -> int:
    """Run the operator coverage suite, which lives with the tests in a source checkout."""
    suite = Path(__file__).resolve().parent.parent / "tests" / "opinfo" / "opinfo_coverage.py"
    if not suite.exists():
        print(
            "python -m turbine coverage: the coverage suite lives in turbine's source tree (tests/opinfo); "
            "run it from a clone installed with pip install -e '.[test]'.",
            file=sys.stderr,
        )
        return 2
    sys.path.insert(0, str(suite.parent))
    import opinfo_coverage

    return opinfo_coverage.main(argv)


def explain_ops(names: list[str]) -> int:
    for name in names:
        try:
            print(explain(resolve(name)))
        except ValueError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["coverage"]:
        return coverage(argv[1:])  # its own options, parsed by the suite
    parser = argparse.ArgumentParser(prog="python -m turbine", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run_demo = commands.add_parser("demo", help="run the README example and compare with torch on the CPU")
    run_demo.add_argument("--device", default="turbine:cpu")
    commands.add_parser("info", help="versions of turbine, torch and IREE; drivers, devices, cache dir")
    cache_parser = commands.add_parser("cache", help="inspect or clear the on-disk kernel cache")
    cache_parser.add_argument("action", choices=["info", "list", "clear"])
    cache_parser.add_argument("--op", help="list: only entries whose op contains this text (e.g. aten.mm)")
    cache_parser.add_argument("--failed", action="store_true", help="clear: only the failed (negative) entries")
    cache_parser.add_argument("--dir", help="the cache directory (default: TURBINE_CACHE_DIR or the user cache dir)")
    explain_parser = commands.add_parser("explain", help="what turbine does with an op and why (e.g. aten.sort.default)")
    explain_parser.add_argument("ops", nargs="+", help="aten overloads: aten.sort.default, aten.add.Tensor, sort.stable")
    commands.add_parser("coverage", help="run the OpInfo operator coverage suite (see: coverage --help)")
    args = parser.parse_args(argv)
    if args.command == "demo":
        return demo(args.device)
    if args.command == "cache":
        return cache(args)
    if args.command == "explain":
        return explain_ops(args.ops)
    return info()


def _quiet_on_closed_pipe() -> int:
    """``cache list | head`` closes the pipe early: stop without a traceback, as shell tools do."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush must not raise again
    return 141  # 128 + SIGPIPE, what a shell reports for a tool stopped this way


if __name__ == "__main__":
    try:
        status = main()
        sys.stdout.flush()
    except BrokenPipeError:
        status = _quiet_on_closed_pipe()
    sys.exit(status)
