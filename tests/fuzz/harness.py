"""The fuzz harness: run each case in a worker process, classify what happened, count.

A case names a loader (its ``kind``) and the loader's argument (a file path, or the text for
``tdag.parse``). A worker process imports tdag once, then runs cases one at a time under a
SIGALRM alarm; the parent also gives each case a hard deadline, and kills and restarts a
worker that does not answer (a loop in C code never sees the alarm) or that died (a segfault,
an abort, the memory limit). Outcomes, per case:

- ``ok``: the loader returned a Program and ``tdag.verify`` accepts it
- ``clean``: the loader raised a TdagError (any subclass)
- ``escape``: any other exception, or the worker died; for the CLI, a traceback, more than
  two lines on stderr, a death by signal, or its "internal error" line (the CLI's name for
  an exception that is not a TdagError)
- ``hang``: no result within the alarm
- ``executed``: the case's marker file appeared, so the input ran code
- ``malformed``: the loader returned a Program that ``tdag.verify`` rejects
- ``leaked``: the loader accepted a file that it must refuse (ONNX external data outside the
  model's folder, which really exists where the file points)
- ``harness``: the case could not even be prepared: a bug of this suite, not of tdag

This file also runs as the worker: ``python harness.py --serve`` (it imports no tdag at the
top, so the parent, which only starts workers, stays light).
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import importlib.util
import json
import os
import queue
import random
import select
import shutil
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

OUTCOMES = ("ok", "clean", "escape", "hang", "executed", "malformed", "leaked", "harness")
BAD = ("escape", "hang", "executed", "malformed", "leaked", "harness")
ALARM_S = 10.0          # per case, in the worker
GRACE_S = 20.0          # past the alarm, before the parent kills a silent worker
START_S = 180.0         # for a worker to import tdag and say it is ready
CLI_TIMEOUT_S = 60.0    # a CLI run starts a fresh interpreter (torch, onnx, tdag)
MEMORY = int(os.environ.get("TDAG_FUZZ_MEMORY", str(8 << 30)))  # worker address space
MARKER = "EXECUTED"     # the file a case's hostile payload creates if it ever runs
MARK = "@MARKER@"       # stands for the marker's path in payloads made before their folder
_TDAG = os.sep + "tdag" + os.sep


@dataclasses.dataclass
class Case:
    target: str            # onnx | tdag | text | pt2 | cli
    mutation: str          # what was done to the seed, readable: "flip[2]@1234 squeezenet"
    kind: str              # the loader: onnx_path | onnx_proto | tdag_path | text | pt2_path
    arg: str               # the file, or the text itself for kind "text"
    marker: str = ""       # a file whose appearance means the input ran code
    must_refuse: bool = False  # loading it at all means data was read from outside its folder
    argv: tuple = ()       # for the CLI: the tdag command line after the program name

    def size(self) -> int:
        if self.kind == "text":
            return len(self.arg)
        try:
            return os.path.getsize(self.arg)
        except OSError:
            return 0


@dataclasses.dataclass
class Result:
    case: Case
    outcome: str
    error: str = ""        # "ExceptionType: message", first 300 characters
    where: str = ""        # the innermost frame in tdag: "tdag/ir/parser.py:120 in _line"
    inner: str = ""        # the innermost frame of all (often in torch, onnx, sympy)
    seconds: float = 0.0
    saved: str = ""        # for a text input: the file it was saved to

    def brief(self) -> str:
        lines = [f"[{self.outcome}] {self.case.target}: {self.case.mutation}",
                 f"    input: {self.case.kind} {_short(self.case.arg)}"]
        if self.saved:
            lines.append(f"    saved: {self.saved}")
        if self.case.argv:
            lines.append(f"    argv: tdag {' '.join(self.case.argv)}")
        if self.error:
            lines.append(f"    error: {self.error}")
        if self.where or self.inner:
            lines.append(f"    at: {self.where or '(no tdag frame)'}"
                         + (f"  <- {self.inner}" if self.inner != self.where else ""))
        return "\n".join(lines)


def _short(text: str, limit: int = 160) -> str:
    text = repr(text) if "\n" in text or not text.isprintable() else text
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


# -- the worker (runs in its own process) ------------------------------------------------------

class _Alarm(BaseException):
    """Raised by SIGALRM inside the worker; a BaseException so no `except Exception` eats it."""


def _on_alarm(signum, frame):
    raise _Alarm("no result before the case's alarm")


def _frames(exc: BaseException) -> tuple[str, str]:
    """(innermost tdag frame, innermost frame) of an exception's traceback."""
    frames = traceback.extract_tb(exc.__traceback__)
    frames = [f for f in frames if not f.filename.endswith("harness.py")] or frames

    def fmt(f) -> str:
        name = f.filename
        cut = name.rfind(_TDAG)
        if cut >= 0:
            name = name[cut + 1:]
        elif "site-packages" + os.sep in name:
            name = name.split("site-packages" + os.sep, 1)[1]
        return f"{name}:{f.lineno} in {f.name}"

    tdag = [f for f in frames if _TDAG in f.filename]
    return (fmt(tdag[-1]) if tdag else ""), (fmt(frames[-1]) if frames else "")


def _describe(exc: BaseException) -> str:
    if isinstance(exc, _Alarm):
        return f"timeout: {exc}"
    cls = type(exc)
    name = cls.__name__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__name__}"
    message = str(exc).strip().replace("\n", " | ")
    return f"{name}: {message[:300]}"


def _loader(kind: str, arg: str):
    """A zero-argument callable that runs the loader; preparing it is not the loader's job."""
    import onnx

    import tdag
    if kind == "onnx_path":
        return lambda: tdag.from_onnx(arg)
    if kind == "onnx_proto":
        model = onnx.ModelProto()
        model.ParseFromString(Path(arg).read_bytes())
        return lambda: tdag.from_onnx(model)
    if kind == "tdag_path":
        return lambda: tdag.load(arg)
    if kind == "text":
        return lambda: tdag.parse(arg)
    if kind == "pt2_path":
        return lambda: tdag.from_torch(arg)
    if kind.startswith("canary_"):
        return _canary(kind[len("canary_"):], arg)
    raise ValueError(f"unknown case kind {kind!r}")


def _canary(what: str, arg: str):
    """Loaders with a known outcome, so that tests can check the classification itself."""
    import torch

    import tdag

    def run():
        if what == "torch_export_load":  # torch's own loader, with none of tdag's checks
            return torch.export.load(arg)
        if what == "write":
            open(arg, "w").close()
        prog = tdag.trace(lambda x: x * 2.0, tdag.TensorSpec((3,)))
        if what == "clean":
            raise tdag.FileFormatError("canary")
        if what == "escape":
            raise KeyError("canary")
        if what == "malformed":
            return tdag.Program.from_tdag(prog.graph.replace(outputs=("nowhere",)))
        if what == "hang":
            while True:
                pass
        if what == "stuck":  # the alarm cannot get through: only the parent's kill ends it
            signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])
            time.sleep(3600)
        if what == "crash":
            os.abort()
        return prog
    return run


def _run_one(request: dict) -> dict:
    import tdag
    from tdag.errors import TdagError
    try:
        load = _loader(request["kind"], request["arg"])
    except Exception as exc:
        return {"outcome": "harness", "error": _describe(exc)}
    stage, outcome, error = "load", "ok", None
    signal.setitimer(signal.ITIMER_REAL, request.get("alarm", ALARM_S))
    try:
        prog = load()
        stage = "verify"
        tdag.verify(prog)
    except _Alarm as exc:
        outcome, error = "hang", exc
    except TdagError as exc:
        outcome, error = ("clean" if stage == "load" else "malformed"), exc
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # SystemExit and RecursionError too: a loader must not
        outcome, error = "escape", exc
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    if error is None:
        return {"outcome": "ok"}
    where, inner = _frames(error)
    text = _describe(error) if stage == "load" else f"in verify: {_describe(error)}"
    return {"outcome": outcome, "error": text, "where": where, "inner": inner}


def _serve() -> None:
    protocol = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # what the loaders print goes to the worker's log, not into the protocol
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))
    import torch

    import tdag  # noqa: F401  (imported once, before the first case)
    torch.set_num_threads(1)
    signal.signal(signal.SIGALRM, _on_alarm)
    protocol.write("ready\n")
    protocol.flush()
    for line in sys.stdin:
        try:
            reply = _run_one(json.loads(line))
        except _Alarm as exc:  # the alarm fired between the loader and the `finally`
            reply = {"outcome": "hang", "error": _describe(exc)}
        protocol.write(json.dumps(reply) + "\n")
        protocol.flush()


# -- the parent side ---------------------------------------------------------------------------

class _Silent(Exception):
    pass


def _child_env(cwd: Path) -> dict:
    """The environment of a worker or a CLI run: this checkout's tdag first, one thread, and
    temporary files (torch's AOTInductor extracts archives there) inside ``cwd``."""
    root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    tmp = cwd / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    return dict(os.environ, PYTHONPATH=path, PYTHONHASHSEED="0", OMP_NUM_THREADS="1",
                TMPDIR=str(tmp))


class Worker:
    """One worker process; restarted after it hangs or dies."""

    def __init__(self, log: Path, cwd: Path):
        self.log, self.cwd = log, cwd
        self.proc: subprocess.Popen | None = None
        self._buffer = b""

    def _start(self) -> None:
        env = _child_env(self.cwd)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve"],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=log, cwd=self.cwd, env=env)
        self._buffer = b""
        if self._readline(START_S) != "ready":
            raise RuntimeError(f"the fuzz worker did not start: see {self.log}")

    def _readline(self, timeout: float) -> str:
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise _Silent()
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise EOFError()
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def run(self, case: Case, alarm: float = ALARM_S, grace: float = GRACE_S) -> Result:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        start = time.monotonic()
        request = json.dumps({"kind": case.kind, "arg": case.arg, "alarm": alarm})
        try:
            self.proc.stdin.write(request.encode() + b"\n")
            self.proc.stdin.flush()
            reply = json.loads(self._readline(alarm + grace))
        except _Silent:
            self.stop()
            reply = {"outcome": "hang", "error": f"no answer within {alarm + grace:g} s; "
                     "the worker was killed (a loop the alarm could not interrupt)"}
        except (EOFError, BrokenPipeError):
            code = self.proc.wait()
            self.proc = None
            what = f"signal {-code}" if code < 0 else f"exit status {code}"
            reply = {"outcome": "escape", "error": f"the worker process died ({what})",
                     "where": "(process)"}
        return _finish(case, reply, time.monotonic() - start)


def _finish(case: Case, reply: dict, seconds: float) -> Result:
    result = Result(case, reply["outcome"], reply.get("error", ""), reply.get("where", ""),
                    reply.get("inner", ""), seconds)
    if case.marker and os.path.exists(case.marker):
        result.error = f"the marker {case.marker} appeared ({result.outcome}: {result.error})"
        result.outcome = "executed"
    elif case.must_refuse and result.outcome == "ok":
        result.outcome = "leaked"
        result.error = "loaded a model whose external data lies outside its folder"
    return result


class Pool:
    """Runs cases on a few workers in parallel (2 by default, TDAG_FUZZ_WORKERS to change)."""

    def __init__(self, out: Path, size: int | None = None):
        size = size or int(os.environ.get("TDAG_FUZZ_WORKERS", min(2, os.cpu_count() or 1)))
        self.cwd = out / "worker-cwd"
        self.cwd.mkdir(parents=True, exist_ok=True)
        self.workers = [Worker(out / f"worker-{i}.log", self.cwd) for i in range(size)]

    def run(self, cases: list[Case], alarm: float = ALARM_S,
            grace: float = GRACE_S) -> list[Result]:
        free: queue.Queue = queue.Queue()
        for w in self.workers:
            free.put(w)

        def one(case: Case) -> Result:
            worker = free.get()
            try:
                return worker.run(case, alarm, grace)
            finally:
                free.put(worker)

        with concurrent.futures.ThreadPoolExecutor(len(self.workers)) as ex:
            return list(ex.map(one, cases))

    def close(self) -> None:
        for w in self.workers:
            w.stop()


# -- the command line --------------------------------------------------------------------------

def cli_prefix() -> list[str]:
    """``python -m tdag`` where tdag/__main__.py exists, else the ``tdag.cli:main`` entry."""
    if importlib.util.find_spec("tdag.__main__") is not None:
        return [sys.executable, "-m", "tdag"]
    return [sys.executable, "-c", "import sys; from tdag.cli import main; sys.exit(main())"]


def run_cli(case: Case, cwd: Path, timeout: float = CLI_TIMEOUT_S) -> Result:
    start = time.monotonic()
    env = _child_env(cwd)
    try:
        proc = subprocess.run(cli_prefix() + list(case.argv), capture_output=True, cwd=cwd,
                              env=env, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        reply = {"outcome": "hang", "error": f"no exit within {timeout:g} s"}
        return _finish(case, reply, time.monotonic() - start)
    stderr = proc.stderr.decode(errors="replace").strip()
    lines = stderr.splitlines()
    first = lines[0][:300] if lines else ""
    if proc.returncode == 0:
        reply = {"outcome": "ok"}
    elif proc.returncode < 0:
        reply = {"outcome": "escape", "error": f"killed by signal {-proc.returncode}",
                 "where": first}
    elif "Traceback" in stderr or len(lines) > 2 or "internal error" in first:
        tail = [ln for ln in lines if ln.strip()][-1][:300] if lines else ""
        where = next((ln.strip() for ln in reversed(lines) if _TDAG in ln), "")
        reply = {"outcome": "escape", "where": where[:200], "inner": first,
                 "error": f"exit {proc.returncode}, {len(lines)} stderr lines"
                          f"{', a traceback' if 'Traceback' in stderr else ''}; last: {tail}"}
    else:
        reply = {"outcome": "clean", "error": first}
    return _finish(case, reply, time.monotonic() - start)


def run_cli_cases(cases: list[Case], cwd: Path, workers: int | None = None) -> list[Result]:
    workers = workers or int(os.environ.get("TDAG_FUZZ_WORKERS", min(2, os.cpu_count() or 1)))
    with concurrent.futures.ThreadPoolExecutor(workers) as ex:
        return list(ex.map(lambda c: run_cli(c, cwd), cases))


# -- cases on disk -----------------------------------------------------------------------------

class CaseDirs:
    """A fresh folder per case under ``out/cases/<target>/``; marker paths live inside it."""

    def __init__(self, out: Path):
        self.root = out / "cases"
        self._count: collections.Counter = collections.Counter()

    def new(self, target: str) -> Path:
        self._count[target] += 1
        path = self.root / target / f"{self._count[target]:05d}"
        path.mkdir(parents=True, exist_ok=False)
        return path

    def write(self, target: str, name: str, data: bytes) -> tuple[Path, str]:
        """A case file holding ``data``, and the case's marker path."""
        folder = self.new(target)
        path = folder / name
        path.write_bytes(data)
        return path, str(folder / MARKER)


def tidy(results: list[Result]) -> None:
    """Drop the folders of cases that went well; keep the others as reproductions."""
    if os.environ.get("TDAG_FUZZ_KEEP"):
        return
    keep = {Path(r.case.arg).parent for r in results
            if r.outcome not in ("ok", "clean") and r.case.kind != "text"}
    for r in results:
        if r.outcome in ("ok", "clean") and r.case.kind != "text":
            folder = Path(r.case.arg).parent
            if folder.parent.parent.name == "cases" and folder not in keep:
                shutil.rmtree(folder, ignore_errors=True)


# -- byte mutations shared by the file targets -------------------------------------------------

def truncations(data: bytes, rng: random.Random, n: int) -> list[tuple[str, bytes]]:
    """``n`` prefixes of ``data``: the middle, one byte short, empty, one byte, random."""
    cuts = [len(data) // 2, len(data) - 1, 0, 1] + [rng.randrange(len(data)) for _ in range(n)]
    return [(f"truncate@{c}/{len(data)}", data[:c]) for c in list(dict.fromkeys(cuts))[:n]]


def flips(data: bytes, rng: random.Random, n: int, most: int = 8,
          span: tuple[int, int] | None = None) -> list[tuple[str, bytes]]:
    """``n`` copies of ``data``, each with 1 to ``most`` bytes XORed (within ``span``)."""
    lo, hi = span or (0, len(data))
    out = []
    for _ in range(n):
        buf = bytearray(data)
        spots = sorted(rng.randrange(lo, hi) for _ in range(rng.randint(1, most)))
        for i in spots:
            buf[i] ^= rng.choice((0x01, 0x80, 0xFF, rng.randrange(1, 256)))
        out.append((f"flip{spots[:4]}{'...' if len(spots) > 4 else ''}", bytes(buf)))
    return out


def splices(data: bytes, rng: random.Random, n: int) -> list[tuple[str, bytes]]:
    """Insert, delete or duplicate a random chunk."""
    out = []
    for _ in range(n):
        i = rng.randrange(len(data))
        k = rng.randint(1, 64)
        how = rng.choice(("insert", "delete", "duplicate"))
        if how == "insert":
            new = data[:i] + rng.randbytes(k) + data[i:]
        elif how == "delete":
            new = data[:i] + data[i + k:]
        else:
            new = data[:i] + data[i:i + k] + data[i:]
        out.append((f"{how}[{k}]@{i}", new))
    return out


# -- the summary -------------------------------------------------------------------------------

class Summary:
    """Counts per target and outcome, and one reproduction per kind of failure."""

    def __init__(self, out: Path):
        self.out = out
        self.counts: dict[str, collections.Counter] = collections.defaultdict(
            collections.Counter)
        self.bad: list[Result] = []
        self.seconds: collections.Counter = collections.Counter()
        self.clean: dict[str, collections.Counter] = collections.defaultdict(
            collections.Counter)  # target -> the TdagError subclasses raised

    def add(self, target: str, results: list[Result]) -> list[Result]:
        """Count ``results`` under ``target``; returns the bad ones. A text that went badly is
        saved to a file (``repro/``), as the file targets' inputs stay in their folders."""
        bad = [r for r in results if r.outcome in BAD]
        for r in bad:
            if r.case.kind == "text" and not r.saved:
                repro = self.out / "repro"
                repro.mkdir(parents=True, exist_ok=True)
                path = repro / f"text-{len(self.bad) + bad.index(r) + 1:05d}.txt"
                path.write_text(r.case.arg, encoding="utf-8", errors="surrogatepass")
                r.saved = str(path)
        for r in results:
            self.counts[target][r.outcome] += 1
            self.seconds[target] += r.seconds
            if r.outcome == "clean":
                name = r.error.split(":")[0].rsplit(".", 1)[-1] if r.case.kind != "cli" \
                    else "exit 1"
                self.clean[target][name] += 1
        self.bad.extend(bad)
        self.write()
        return bad

    def table(self) -> str:
        head = f"{'target':<14}{'cases':>7}" + "".join(f"{o:>10}" for o in OUTCOMES)
        rows = [head, "-" * len(head)]
        total: collections.Counter = collections.Counter()
        for target in sorted(self.counts):
            c = self.counts[target]
            total.update(c)
            rows.append(f"{target:<14}{sum(c.values()):>7}"
                        + "".join(f"{c[o]:>10}" for o in OUTCOMES))
        rows.append(f"{'total':<14}{sum(total.values()):>7}"
                    + "".join(f"{total[o]:>10}" for o in OUTCOMES))
        rows.append("clean, by error type: " + "; ".join(
            f"{t}: " + ", ".join(f"{k} {v}" for k, v in self.clean[t].most_common())
            for t in sorted(self.clean)))
        return "\n".join(rows)

    def groups(self, results: list[Result] | None = None) -> list[tuple[int, Result]]:
        """(count, smallest reproduction) per (target, outcome, error type, tdag frame)."""
        found: dict[tuple, list[Result]] = collections.defaultdict(list)
        for r in self.bad if results is None else results:
            found[(r.case.target, r.outcome, r.error.split(":")[0], r.where)].append(r)
        return [(len(rs), min(rs, key=lambda r: (r.case.size(), r.case.mutation)))
                for _, rs in sorted(found.items())]

    def report(self, results: list[Result] | None = None) -> str:
        parts = [self.table()]
        groups = self.groups(results)
        if groups:
            parts.append(f"\n{len(groups)} kind(s) of failure, smallest reproduction each:")
            parts.extend(f"({n} case(s)) {r.brief()}" for n, r in groups)
        return "\n".join(parts)

    def write(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        data = {"counts": {t: dict(c) for t, c in self.counts.items()},
                "seconds": dict(self.seconds),
                "clean_types": {t: dict(c) for t, c in self.clean.items()},
                "failures": [dict(count=n, outcome=r.outcome, target=r.case.target,
                                  mutation=r.case.mutation, kind=r.case.kind,
                                  arg=r.case.arg[:2000], saved=r.saved,
                                  argv=list(r.case.argv),
                                  error=r.error, where=r.where, inner=r.inner)
                             for n, r in self.groups()]}
        (self.out / "summary.json").write_text(json.dumps(data, indent=1))
        (self.out / "summary.txt").write_text(self.report() + "\n")


def record(summary: Summary, target: str, results: list[Result]) -> None:
    """Count ``results`` and fail, with the counts and reproductions, if any went badly."""
    tidy(results)
    bad = summary.add(target, results)
    assert not bad, f"{len(bad)} bad outcome(s) among {len(results)} {target} cases\n" + \
        summary.report(bad)


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
    _serve()
