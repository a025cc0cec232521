"""The sandbox child: runs one program under resource limits, import allow-list and audit hooks.

Started by `colony.planning.sandbox.run_sandboxed` as `python -I -S <this file>`. Protocol (JSON
lines): stdin first carries {"code", "limits", "actions"}; the child writes {"call", "params"}
and reads {"ok", "result" | "error"} for every action call; it ends with
{"done": true, "ok", "error", "stdout"}. Standard library only, and only what it needs.
"""

import builtins
import contextlib
import io
import json
import resource
import sys

ALLOWED_MODULES = frozenset(
    {
        "json",
        "math",
        "re",
        "itertools",
        "functools",
        "collections",
        "statistics",
        "datetime",
        "random",
        "string",
        "typing",
        "dataclasses",
        "decimal",
        "fractions",
        "heapq",
        "bisect",
        "operator",
        "textwrap",
        "enum",
        "copy",
        "difflib",
        "unicodedata",
    }
)
BLOCKED_EVENTS = (
    "open",
    "os.",
    "socket.",
    "subprocess.",
    "shutil.",
    "ctypes.",
    "pty.",
    "mmap.",
    "fcntl.",
    "resource.",
    "signal.",
    "sys._getframe",
    "sys.settrace",
    "sys.setprofile",
)
_IO = {"in": sys.stdin, "out": sys.stdout}


def _send(message):
    _IO["out"].write(json.dumps(message) + "\n")
    _IO["out"].flush()


def _limits(limits):
    cpu = int(limits["cpu_seconds"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    memory = int(limits["memory_mb"]) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))


def _guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
    root = name.split(".")[0]
    if level != 0 or root not in ALLOWED_MODULES:
        raise ImportError(
            f"import of {name!r} is not allowed in the sandbox (allowed: {sorted(ALLOWED_MODULES)})"
        )
    return _real_import(name, globals, locals, fromlist, level)


_real_import = builtins.__import__


def _audit(event, args):
    if event == "import":
        root = str(args[0]).split(".")[0]
        if root in ALLOWED_MODULES or root in sys.modules:
            return
        raise PermissionError(f"sandbox: import of {args[0]!r} is not allowed")
    if event.startswith(BLOCKED_EVENTS):
        raise PermissionError(f"sandbox: {event} is not allowed (no files, processes or network)")


def main():
    request = json.loads(_IO["in"].readline())
    for module in ALLOWED_MODULES:  # preload, so programs import them without touching the disk
        with contextlib.suppress(ImportError):
            _real_import(module)
    stdout = io.StringIO()

    def sandbox_print(*args, sep=" ", end="\n", file=None, flush=False):
        stdout.write(sep.join(str(a) for a in args) + end)

    def run(action_key, **params):
        if action_key not in request["actions"]:
            raise NameError(f"unknown action {action_key!r}; available: {sorted(request['actions'])}")
        _send({"call": action_key, "params": params})
        reply = json.loads(_IO["in"].readline())
        if not reply.get("ok"):
            raise RuntimeError(f"{action_key} failed: {reply.get('error')}")
        return reply.get("result")

    safe_builtins = {
        k: v
        for k, v in vars(builtins).items()
        if k not in ("open", "input", "breakpoint", "exit", "quit", "help")
    }
    safe_builtins["__import__"] = _guarded_import
    safe_builtins["print"] = sandbox_print
    namespace = {"__builtins__": safe_builtins, "__name__": "__sandbox__", "run": run}
    _limits(request["limits"])
    sys.addaudithook(_audit)
    try:
        exec(compile(request["code"], "<generated>", "exec"), namespace)
        _send({"done": True, "ok": True, "error": None, "stdout": stdout.getvalue()[-20000:]})
    except MemoryError:
        _send(
            {
                "done": True,
                "ok": False,
                "error": "MemoryError: the program went over its memory limit",
                "stdout": stdout.getvalue()[-20000:],
            }
        )
    except BaseException as exc:  # the program's failure is the result
        _send(
            {
                "done": True,
                "ok": False,
                "error": f"{type(exc).__name__}: {exc}",
                "stdout": stdout.getvalue()[-20000:],
            }
        )


main()
