"""A parent process that has already imported falcon, for the test suite's CLI runs.

A ``falcon`` command that runs a stage spends about 6 of its first 7 seconds importing torch, torch._dynamo
(every optimizer step needs it), torchvision, transformers, open_clip and matplotlib; most test runs train for
a fraction of a second after that. This script imports all of it once, then serves requests from
:func:`tests.conftest.run_cli`: for each command line it forks a child that takes the request's working
directory, environment, argv and standard streams (files the test reads back) and runs
``falcon_cli.cli.app.main`` exactly as ``python -m falcon_cli`` would, in its own process, with its own exit
status. The zygote itself never runs a torch operation (no thread pools, no CUDA context), so forking it is
safe.

Protocol (one JSON object per line): a request ``{"argv", "cwd", "env", "stdout", "stderr"}`` on stdin is
answered with ``{"pid": P}`` when the child starts and ``{"status": S}`` (its ``os.wait`` status) when it ends.
End of input ends the zygote.
"""

from __future__ import annotations

import json
import os
import sys


def preload() -> None:
    """Import what a falcon command imports (each module is imported once, here, for every child).

    Every module of falcon_cli and stages: the command line imports the stages, and the stages some of falcon's
    own modules (a model family's network, a judge), only where a command runs them, so that `falcon --help`
    stays fast (tests/cli/test_cli_latency.py); a child should find them all imported.
    """
    import importlib
    import pkgutil

    import falcon_cli
    import stages

    # torch._dynamo: the first optimizer step imports it; transformers: the run tokenizer's class
    for name in ("torch._dynamo", "torchvision"):
        importlib.import_module(name)
    importlib.import_module("transformers").BertTokenizerFast
    for package in (falcon_cli, stages):
        for module in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            if not module.name.endswith(".__main__"):  # (`python -m falcon_cli` itself: it would run the command)
                importlib.import_module(module.name)
    for optional in ("open_clip", "timm", "h5py", "pyarrow.parquet"):
        try:
            importlib.import_module(optional)
        except ImportError:
            pass


def child(request: dict, channels: tuple[int, int]) -> None:
    """Become ``python -m falcon_cli ARGV`` in the request's directory and environment; never returns."""
    import atexit
    import traceback

    code = 1
    try:
        for fd in channels:
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.path[0] = os.getcwd()  # as `python -m` puts the working directory first
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(out, fd)
            os.close(out)
        sys.stdout = os.fdopen(1, "w", closefd=False)
        sys.stderr = os.fdopen(2, "w", buffering=1, errors="backslashreplace", closefd=False)
        sys.argv = [os.path.join(os.path.dirname(sys.modules["falcon_cli"].__file__), "__main__.py"), *request["argv"]]
        from falcon_cli.cli.app import main

        main()
        code = 0
    except SystemExit as exc:  # what the interpreter does with sys.exit's argument
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        try:
            atexit._run_exitfuncs()
            for stream in (
                sys.stdout,
                sys.stderr,
                sys.__stdout__,
                sys.__stderr__,
            ):  # (the zygote's own, on fds 1 and 2 now)
                stream.flush()
        finally:
            os._exit(code & 0xFF)


def serve() -> None:
    """Answer requests until stdin closes; stdout carries only the protocol."""
    requests, replies = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(2, 1)  # anything the imports print goes where the zygote's stderr goes, not into the protocol
    os.close(null)
    preload()
    sys.stdout.flush()
    sys.stderr.flush()
    with os.fdopen(requests, "r") as lines:
        for line in lines:
            request = json.loads(line)
            pid = os.fork()
            if pid == 0:
                child(request, (requests, replies))
            os.write(replies, (json.dumps({"pid": pid}) + "\n").encode())
            _, status = os.waitpid(pid, 0)
            os.write(replies, (json.dumps({"status": status}) + "\n").encode())


if __name__ == "__main__":
    serve()
