"""The operator coverage run: every op_db entry through opinfo_runner, in worker processes.

    python -m turbine coverage [--jobs N] [--samples N] [--ops NAME ...] [--out docs]

Entries are shared out to ``--jobs`` worker processes, one entry at a time. A worker that dies
(a crash in a native library) or runs past ``--timeout`` seconds on one entry is replaced, and
that entry's unfinished cases are recorded as failures saying so. The kernels compiled land in
the disk cache, so a second run mostly loads them. The report goes to
``<out>/op-coverage.md`` (totals, common failures, a row per entry) and ``<out>/op-coverage.json``.

A run stopped by Ctrl-C or SIGTERM (a time limit) still writes the report of the entries it
finished, saying which were not run; ``--resume`` then runs only those and adds them to it.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime
import json
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


# --- worker side --------------------------------------------------------------------------


def worker(device: str, samples: int) -> None:
    """Read entry names from stdin; print one JSON line per case, then ``{"done": name, "lost":
    why}``, where ``why`` says the device was lost in the entry (the worker then ends) or is None."""
    import warnings

    sys.path.insert(0, str(HERE))
    import opinfo_runner

    warnings.simplefilter("ignore")  # fallback warnings and OpInfo's own would flood the pipe
    known = opinfo_runner.entries()
    for line in sys.stdin:
        name = line.strip()
        for result in opinfo_runner.run_entry(known[name], device, samples):
            print(json.dumps({"result": dataclasses.asdict(result)}), flush=True)
        lost = _device_lost(device)
        print(json.dumps({"done": name, "lost": lost}), flush=True)
        if lost:
            return  # nothing can run on this process's device again: the parent starts another


def _device_lost(device: str) -> str | None:
    """Why the device can no longer run work (a kernel of the last entry faulted), else None.

    A GPU context a kernel faulted in is lost for the process; had the worker gone on, every later
    entry would have failed in a few milliseconds with the same error (the first GPU run lost 130
    entries that way). torch's view is asked too: a fault can poison the context IREE and torch
    share without any turbine call seeing it yet."""
    import torch

    from turbine.device import open_device

    from turbine.device import failures

    opened = open_device(device)
    if opened.lost is None and opened.kind == "cuda" and torch.cuda.is_initialized():
        try:
            torch.cuda.synchronize(opened.spec.ordinal)
        except Exception as error:  # marked lost, so that the process leaves without releasing it
            failures.failure(opened, error, "after the entry")
            return opened.lost or str(error).strip().splitlines()[0]
    return opened.lost


# --- parent side --------------------------------------------------------------------------


class Worker:
    """One worker process, its stderr log and a thread that forwards its stdout lines."""

    def __init__(self, number: int, events: queue.Queue, args: argparse.Namespace) -> None:
        self.number = number
        self.log = tempfile.TemporaryFile(mode="w+")
        command = [sys.executable, __file__, "--worker", "--device", args.device, "--samples", str(args.samples)]
        # No kernel bundles: each worker runs thousands of one-off kernels, no workload to load
        # again, and each would leave a builder compiling 256 of them after it exits.
        environment = dict(os.environ, TURBINE_CACHE_BUNDLES="0", TURBINE_CACHE_PLANS="0")
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, bufsize=1, env=environment
        )
        self.entry: str | None = None
        self.started = 0.0
        self.retired = False  # its device was lost: it ends after its entry, and another takes over
        threading.Thread(target=self._forward, args=(events,), daemon=True).start()

    def _forward(self, events: queue.Queue) -> None:
        for line in self.process.stdout:
            events.put((self, line))
        events.put((self, None))

    def give(self, entry: str | None) -> None:
        """Start an entry, or (None) tell the worker to finish. A worker that died meanwhile
        cannot be told: its end of output then reports it, with this entry as its crash."""
        self.entry = entry
        self.started = time.monotonic()
        try:
            if entry is None:
                self.process.stdin.close()
            else:
                self.process.stdin.write(entry + "\n")
                self.process.stdin.flush()
        except OSError:  # BrokenPipeError: the process is gone
            pass

    def last_error_line(self) -> str:
        self.log.seek(0)
        lines = [line.strip() for line in self.log.read().splitlines() if line.strip()]
        return lines[-1][:200] if lines else f"exit status {self.process.poll()}"


class Interrupted(Exception):
    """Ctrl-C or SIGTERM during a run: the entries finished so far are still reported."""


def run_all(names: list[str], args: argparse.Namespace) -> tuple[list[dict], list[str]]:
    """Run every named entry in worker processes: the results of every case of the entries
    finished (crashed or not), and the names not finished when the run was interrupted."""
    sys.path.insert(0, str(HERE))
    import opinfo_runner
    from tqdm import tqdm

    known = opinfo_runner.entries()
    events: queue.Queue = queue.Queue()
    pending = collections.deque(names)
    results: dict[tuple, dict] = {}
    finished: set[str] = set()
    progress = tqdm(total=len(names), unit="entry", disable=not sys.stderr.isatty())
    workers = [Worker(i, events, args) for i in range(min(args.jobs, len(names)))]
    try:
        for w in workers:
            w.give(pending.popleft() if pending else None)
        running = len(workers)
        while running:
            try:
                w, line = events.get(timeout=5)
            except queue.Empty:
                for w in workers:
                    if w.entry is not None and time.monotonic() - w.started > args.timeout:
                        w.process.kill()  # its forwarding thread then reports None
                continue
            if line is not None:
                message = json.loads(line)
                if "result" in message:
                    result = message["result"]
                    results[(result["op"], result["variant"], result["dtype"], result["direction"])] = result
                    continue
                finished.add(message["done"])
                progress.update(1)
                progress.set_postfix_str(message["done"][:30])
                _log_entry(message["done"], results, args.quiet)
                if message.get("lost"):
                    print(f"{args.device} was lost in {message['done']} ({message['lost']}); a new worker goes on", file=sys.stderr)
                    w.entry, w.retired = None, True
                    w.process.kill()  # its results are in; a lost context may never let it exit
                    place = workers.index(w)
                    w = workers[place] = Worker(w.number, events, args)
                w.give(pending.popleft() if pending else None)
                continue
            if w.retired:
                continue  # a worker whose device was lost, ending as it should
            # The worker ended: normally after its last entry, else it crashed or timed out.
            if w.entry is not None:
                if w.process.wait() in (-signal.SIGINT, -signal.SIGTERM):
                    time.sleep(1)  # a Ctrl-C or time limit for the whole run reaches this process too
                    # (its handler raises Interrupted meanwhile); else the worker alone was stopped
                timed_out = time.monotonic() - w.started > args.timeout
                why = f"timed out after {args.timeout} s" if timed_out else f"the worker process died: {w.last_error_line()}"
                op = known[w.entry]
                for variant, dtype, direction in opinfo_runner.cases(op):
                    key = (w.entry, variant, dtype, direction)
                    if key not in results:
                        results[key] = dataclasses.asdict(opinfo_runner.Result(*key, status="fail", detail=why))
                finished.add(w.entry)
                progress.update(1)
                _log_entry(w.entry, results, args.quiet)
                replacement = Worker(w.number, events, args)
                workers[workers.index(w)] = replacement
                replacement.give(pending.popleft() if pending else None)
                continue
            running -= 1
    except (Interrupted, KeyboardInterrupt):
        for w in workers:
            w.process.kill()
    progress.close()
    kept = [results[key] for key in sorted(results) if key[0] in finished]
    return kept, [name for name in names if name not in finished]


def _stop_on_sigterm() -> Any:
    """A time limit's SIGTERM ends the run the way Ctrl-C does, so the report is still written;
    returns the handler that was there, to put back once the run is over."""

    def stop(signum: int, frame: Any) -> None:
        raise Interrupted

    return signal.signal(signal.SIGTERM, stop)


def _previous_run(args: argparse.Namespace) -> tuple[list[dict], dict]:
    """For --resume: the cases of the entries an earlier run finished, and its report's meta
    (its seconds, the entries it did not run). Its device, samples, torch and IREE must be this
    run's, or the two halves would not make one report."""
    import torch

    from turbine.kernels_cache.target import compiler_version

    path = Path(args.out) / "op-coverage.json"
    if not path.exists():
        return [], {"seconds": 0.0, "not_run": []}
    report = json.loads(path.read_text())
    meta = report["meta"]
    now = {"device": args.device, "samples_per_case": args.samples, "torch": torch.__version__, "iree": compiler_version()}
    differ = [f"{key} {meta.get(key)!r} (now {value!r})" for key, value in now.items() if meta.get(key) != value]
    if differ:
        raise SystemExit(
            f"--resume: {path} was made with another {', '.join(differ)}; "
            "give another --out, or run without --resume to start over"
        )
    import opinfo_runner

    # The report leaves out empty fields; the Result dataclass restores them.
    return [dataclasses.asdict(opinfo_runner.Result(**r)) for r in report["results"]], meta


def _log_entry(name: str, results: dict, quiet: bool) -> None:
    if quiet:
        return
    statuses = [r["status"] for key, r in results.items() if key[0] == name]
    print(f"{name}: " + ", ".join(f"{n} {s}" for s, n in collections.Counter(statuses).items()), file=sys.stderr)


# --- the report ---------------------------------------------------------------------------

CASE_COLUMNS = [
    ("forward float32", ("function", "float32", "forward")),
    ("forward int64", ("function", "int64", "forward")),
    ("method float32", ("method", "float32", "forward")),
    ("in-place float32", ("inplace", "float32", "forward")),
    ("backward float32", ("function", "float32", "backward")),
]


def summarize(results: list[dict]) -> dict[str, Any]:
    """Totals per case column, the share run on IREE alone, and the commonest failure causes."""
    by_case = {(r["op"], r["variant"], r["dtype"], r["direction"]): r for r in results}
    entries = sorted({r["op"] for r in results})
    totals = {}
    for label, case in CASE_COLUMNS:
        statuses = collections.Counter(by_case[(op, *case)]["status"] for op in entries if (op, *case) in by_case)
        applicable = sum(statuses[s] for s in ("pass", "fail", "skip"))
        totals[label] = {
            "pass": statuses["pass"],
            "fail": statuses["fail"],
            "skip": statuses["skip"],
            "n/a": statuses["n/a"],
            "pass_rate": round(statuses["pass"] / applicable, 4) if applicable else None,
        }
    forward = [by_case.get((op, "function", "float32", "forward")) for op in entries]
    applicable = [r for r in forward if r is not None and r["status"] != "n/a"]
    native = [r for r in applicable if r["status"] == "pass" and set(r["executors"]) <= {"iree"}]
    totals["forward float32 on IREE kernels alone"] = {
        "pass": len(native),
        "pass_rate": round(len(native) / len(applicable), 4) if applicable else None,
    }
    causes = collections.Counter(_cause(r["detail"]) for r in results if r["status"] == "fail")
    return {"entries": len(entries), "totals": totals, "common_failures": causes.most_common(15)}


def _cause(detail: str) -> str:
    """A failure's message with its particulars (numbers, shapes, quoted names) masked, to group by."""
    text = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", detail)
    text = re.sub(r"\[[^\]]*\]|\([^)]*\)", "(…)", text)
    text = re.sub(r"\d+(\.\d+)?(e-?\d+)?", "N", text)
    return text[:140]


def write_report(
    results: list[dict], args: argparse.Namespace, seconds: float, not_run: list[str]
) -> tuple[Path, Path]:
    import torch

    from turbine.kernels_cache.target import compiler_version

    summary = summarize(results)
    meta = {
        "generated": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python -m turbine coverage " + " ".join(args.argv),
        "device": args.device,
        "torch": torch.__version__,
        "iree": compiler_version(),
        "samples_per_case": args.samples,
        "seconds": round(seconds, 1),
        "not_run": not_run,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / "op-coverage.json", out / "op-coverage.md"
    json_path.write_text(_json_lines({"meta": meta, "summary": summary}, results))
    md_path.write_text(_markdown(meta, summary, results))
    return md_path, json_path


def _json_lines(head: dict, results: list[dict]) -> str:
    """The report as JSON with one case per line: small, and a rerun's diff shows what changed.
    Fields with nothing in them (no detail, no executors, 0 samples) and the per-case seconds
    (noise from run to run) are left out of a case."""
    compact = {"separators": (",", ":")}
    kept = [{k: v for k, v in r.items() if k != "seconds" and v not in ("", [], 0)} for r in results]
    lines = [json.dumps(case, **compact) for case in kept]
    opening = json.dumps(head, **compact)[:-1]
    return opening + ',"results":[\n' + ",\n".join(lines) + "\n]}\n"


_MARKS = {"pass": "pass", "fail": "FAIL", "skip": "skip", "n/a": "-"}


def _markdown(meta: dict, summary: dict, results: list[dict]) -> str:
    by_case = {(r["op"], r["variant"], r["dtype"], r["direction"]): r for r in results}
    lines = [
        f"# Operator coverage on {meta['device']}",
        "",
        f"PyTorch's OpInfo database (`op_db`, {summary['entries']} entries run), torch {meta['torch']}, "
        f"IREE {meta['iree']}, at most {meta['samples_per_case']} samples per case, generated "
        f"{meta['generated']} by `{meta['command'].strip()}` in {meta['seconds']:.0f} s.",
        "Each sample is compared with torch on the CPU (`torch.testing.assert_close`, OpInfo's tolerances;",
        "random ops on shape and dtype). A case passes when all its samples do. `-`: torch has no such",
        "variant or dtype for the entry. Skips and their reasons: `tests/opinfo/opinfo_skips.py`.",
        "",
    ]
    if meta["not_run"]:
        lines += [
            f"**Interrupted: {len(meta['not_run'])} entries not run** (`--resume` runs them): "
            + ", ".join(f"`{name}`" for name in meta["not_run"][:20])
            + (", ..." if len(meta["not_run"]) > 20 else ""),
            "",
        ]
    lines += [
        "## Totals",
        "",
        "| case | pass | fail | skip | n/a | pass rate |",
        "|---|---|---|---|---|---|",
    ]
    for label, row in summary["totals"].items():
        rate = "" if row["pass_rate"] is None else f"{100 * row['pass_rate']:.1f}%"
        if "fail" in row:
            lines.append(f"| {label} | {row['pass']} | {row['fail']} | {row['skip']} | {row['n/a']} | {rate} |")
        else:
            lines.append(f"| {label} | {row['pass']} | | | | {rate} |")
    lines += ["", "## Most common failures", "", "| cases | first line of the error |", "|---|---|"]
    lines += [f"| {count} | {_cell(cause)} |" for cause, count in summary["common_failures"]]
    header = " | ".join(label for label, _ in CASE_COLUMNS)
    lines += ["", "## Per entry", "", f"| entry | {header} | ran on | first failure or skip |"]
    lines.append("|---" * (len(CASE_COLUMNS) + 3) + "|")
    for op in sorted({r["op"] for r in results}):
        cells = [by_case.get((op, *case)) for _, case in CASE_COLUMNS]
        marks = [_MARKS[c["status"]] if c else "" for c in cells]
        ran = sorted({e for c in cells if c for e in c["executors"]})
        notes = [c["detail"] for c in cells if c and c["status"] in ("fail", "skip")]
        lines.append(f"| `{op}` | " + " | ".join(marks) + f" | {', '.join(ran)} | {_cell(notes[0]) if notes else ''} |")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")[:160]


# --- command line -------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m turbine coverage", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="turbine:cpu")
    parser.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)), help="worker processes")
    parser.add_argument("--samples", type=int, default=4, help="samples per case (OpInfo gives 1 to 100+)")
    parser.add_argument("--ops", nargs="*", help="entry names (default: all of op_db)")
    parser.add_argument("--timeout", type=int, default=900, help="seconds one entry may take")
    parser.add_argument("--out", default=str(HERE.parent.parent / "docs"), help="where op-coverage.md/.json go")
    parser.add_argument("--quiet", action="store_true", help="no line per entry")
    parser.add_argument("--resume", action="store_true", help="run only the entries missing from --out's report")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.argv = [a for a in argv if a not in ("--quiet", "--resume")]
    if args.worker:
        worker(args.device, args.samples)
        return 0
    sys.path.insert(0, str(HERE))
    import opinfo_runner

    known = opinfo_runner.entries()
    names = args.ops or list(known)
    unknown = [n for n in names if n not in known]
    if unknown:
        parser.error(f"not op_db entries: {', '.join(unknown)} (names look like 'add' or 'max.reduction_with_dim')")
    previous, before = _previous_run(args) if args.resume else ([], {"seconds": 0.0, "not_run": []})
    done_before = {r["op"] for r in previous}
    to_run = [n for n in names if n not in done_before]
    start = time.monotonic()
    handler = _stop_on_sigterm()
    results, not_run = run_all(to_run, args)
    signal.signal(signal.SIGTERM, handler)
    # entries an earlier run left that this one was not asked for stay listed as not run
    not_run += [n for n in before["not_run"] if n not in to_run and n not in done_before]
    seconds = before["seconds"] + time.monotonic() - start
    md_path, json_path = write_report(previous + results, args, seconds, not_run)
    for label, row in summarize(previous + results)["totals"].items():
        rate = "n/a" if row["pass_rate"] is None else f"{100 * row['pass_rate']:.1f}%"
        print(f"{label}: {row['pass']} pass ({rate})")
    print(f"wrote {md_path} and {json_path}")
    if not_run:
        print(f"interrupted: {len(not_run)} entries not run; add --resume to run them", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
