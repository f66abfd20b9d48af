"""The ``onnxopt`` command runs its work in a child process, so that a native crash is one error line.

ONNX Runtime (and onnx's C++ shape inference) can die on an unusual or hostile model with a signal
instead of an exception: onnx-asr's wespeaker front end, given less audio than one frame, kills
ORT 1.32 with SIGFPE. The process is then gone with no message (exit 136 or 139), whatever
handler Python has. So the command starts itself again as a child (marked by an environment
variable) and only waits; the child notes what it is about to do (:func:`doing`) in a file the
two share (named in the environment, so that the child's own worker processes can note there
too), and when it dies of a crash signal the parent prints what it was doing, in one line,
and exits 2 like any other bad input. Other ends pass through unchanged: an exit code as it is,
SIGKILL (the out-of-memory killer) or SIGTERM by dying of the same signal.

A process that dies so runs no cleanup of its own, so the temp files and folders the command makes
(a copy of the optimized model for ONNX Runtime, an output being written under a temp name) are
listed as they are made (:func:`leave_no_trace`) in a second shared file, and the parent removes
whatever of them is left when the child has ended, however it ended.

The parent imports nothing heavy (one more Python start, ~50 ms), forwards SIGTERM and SIGHUP
to the child and leaves Ctrl-C to it (both are in the terminal's process group).
``ONNXOPT_NO_GUARD=1``, or a platform where a child's exit status does not say which signal
ended it (not POSIX), runs the command in-process.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator

NOTES = "ONNXOPT_NOTES"  # the shared notes file's path
_SCRATCH = "scratch"  # beside the notes file: the temp paths to remove, each ended by a NUL
PROG_NAME = "ONNXOPT_PROG_NAME"  # the name the user typed, for usage lines
NO_GUARD = "ONNXOPT_NO_GUARD"
EXIT_ERROR = 2  # cli.EXIT_ERROR (not imported: click costs the parent 60 ms)
_NOTE_BYTES = 2000

# Signals a process dies of by itself (a fault in native code), with what each means.
CRASHES = {
    signal.SIGSEGV: "a segmentation fault",
    signal.SIGFPE: "an arithmetic fault",
    signal.SIGBUS: "a bus error",
    signal.SIGILL: "an illegal instruction",
    signal.SIGABRT: "an abort",
}

_notes_fd: int | None = None
_notes_path: str | None = None
_stack: list[str] = []


def _write_note() -> None:
    global _notes_fd
    if _notes_fd is None:
        return
    data = ": ".join(_stack).encode("utf-8", "replace")[:_NOTE_BYTES]
    try:
        os.ftruncate(_notes_fd, 0)
        os.pwrite(_notes_fd, data, 0)
    except OSError:
        _notes_fd = None  # the parent is gone or the file unusable: stop noting


@contextlib.contextmanager
def doing(activity: str) -> Iterator[None]:
    """Note ``activity`` ("ONNX Runtime ran the original model on inputs x[1, 400]") for the
    length of the block: a native crash inside it is reported as happening "while" it, after
    the activities it is nested in ("optimizing m.onnx: ONNX Runtime ran ...")."""
    _stack.append(activity)
    _write_note()
    try:
        yield
    finally:
        _stack.pop()
        _write_note()


def leave_no_trace(path: str | os.PathLike[str]) -> None:
    """Note that ``path``, a temp file or folder this process just made, must not outlive the
    command: the guarding parent removes it if this process dies before removing (or renaming)
    it itself. Outside a guarded command, nothing to do."""
    if _notes_path is None:
        return
    entry = os.fsencode(os.path.abspath(path)) + b"\0"
    with contextlib.suppress(OSError):
        fd = os.open(_scratch_list(_notes_path), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, entry)  # one small appended write: the workers' entries do not interleave
        finally:
            os.close(fd)


@contextlib.contextmanager
def temp_folder(prefix: str) -> Iterator[str]:
    """A temp folder, removed at the end of the block, and by the guarding parent should this
    process die inside it."""
    with tempfile.TemporaryDirectory(prefix=prefix) as folder:
        leave_no_trace(folder)
        yield folder


def _scratch_list(notes: str) -> str:
    return os.path.join(os.path.dirname(notes), _SCRATCH)


def _remove_scratch(notes: str) -> None:
    """Remove the temp paths the child listed that are still there (a child that ended normally
    removed or renamed its own)."""
    try:
        with open(_scratch_list(notes), "rb") as listing:
            entries = listing.read().split(b"\0")
    except OSError:
        return
    for entry in filter(None, entries):
        path = os.fsdecode(entry)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(path)


def notes_path() -> str | None:
    """The notes file of this process (None outside a guarded command), for worker processes."""
    return _notes_path


def adopt_notes(path: str | None) -> None:
    """In a worker process: note into ``path`` too (a pool's initializer)."""
    global _notes_fd, _notes_path
    if path is None or _notes_fd is not None:
        return
    try:
        _notes_fd = os.open(path, os.O_RDWR)
    except OSError:
        return
    _notes_path = path


def last_note() -> str:
    """What the notes file holds now: in a process pool's parent, what a worker that died last
    noted (the workers, forked, share the file)."""
    if _notes_fd is None:
        return ""
    with contextlib.suppress(OSError):
        return os.pread(_notes_fd, _NOTE_BYTES, 0).decode("utf-8", "replace")
    return ""


def crash_message(signal_number: int, activity: str, command: str) -> str:
    """The one line the parent prints for a child that died of ``signal_number``."""
    died_of = signal.Signals(signal_number)
    during = activity or f"running '{command}'"
    return (
        f"onnxopt: error: the process crashed ({died_of.name}, {CRASHES[died_of]}) while {during}"
    )


def _run_child() -> int | None:
    """Run this command again as a child; its exit code, or the crash line's code (None: no
    child could be started, no temp file or no interpreter to start: run in-process instead)."""
    script = os.path.basename(sys.argv[0])
    try:
        # a private folder: the notes file and, beside it, the child's list of temp paths
        folder = tempfile.mkdtemp(prefix="onnxopt-notes-")
    except OSError:
        return None
    path = os.path.join(folder, "notes")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:
        shutil.rmtree(folder, ignore_errors=True)
        return None
    try:
        env = dict(os.environ)
        env[NOTES] = path
        if script != "__main__.py":
            env[PROG_NAME] = script
        # the interpreter's own options too (-X utf8, -W error, -I ...), as multiprocessing does
        flags: list[str] = getattr(subprocess, "_args_from_interpreter_flags", list)()
        command = [sys.executable, *flags, "-m", "onnxopt", *sys.argv[1:]]
        try:
            child = subprocess.Popen(command, env=env)
        except OSError:
            return None

        def forward(number: int, _frame: object) -> None:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(number)

        handlers = {
            signal.SIGINT: signal.signal(signal.SIGINT, signal.SIG_IGN),  # the child answers it
            signal.SIGTERM: signal.signal(signal.SIGTERM, forward),
            signal.SIGHUP: signal.signal(signal.SIGHUP, forward),
        }
        try:
            code = child.wait()
        finally:
            for number, handler in handlers.items():
                signal.signal(number, handler)
        activity = os.pread(fd, _NOTE_BYTES, 0).decode("utf-8", "replace")
    finally:
        os.close(fd)
        _remove_scratch(path)
        shutil.rmtree(folder, ignore_errors=True)
    if code >= 0:
        return code
    died_of = -code
    if died_of in CRASHES:
        shown = " ".join(["onnxopt", *sys.argv[1:]])
        print(crash_message(died_of, activity, shown), file=sys.stderr, flush=True)
        return EXIT_ERROR
    # Killed from outside: end the same way, so that whoever started us sees what they did.
    signal.signal(died_of, signal.SIG_DFL)
    os.kill(os.getpid(), died_of)
    return 128 + died_of


def _die_with_parent() -> None:
    """Linux: the child gets SIGTERM when the parent dies (even by SIGKILL), instead of running on."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG


def main() -> None:
    """The ``onnxopt`` command: the guarding parent, or (in the child) the command line itself."""
    notes = os.environ.pop(NOTES, None)
    prog_name = os.environ.pop(PROG_NAME, None)
    guarded = notes is None and os.name == "posix" and bool(sys.executable)
    if guarded and not os.environ.get(NO_GUARD):
        code = _run_child()
        if code is not None:
            sys.exit(code)
    if notes is not None:
        adopt_notes(notes)
        _die_with_parent()
    from onnxopt.cli import main as cli

    cli(prog_name=prog_name)
