"""The user's Python callables named in a config: `module:function` or `path/to/file.py:function`;
and the user's modules the CLI imports first (`--plugin path/to/file.py|module`, `load_module`).

`module:function` is found as `python -m` finds a module: from the current folder first, then the
installed packages, so `reward_fn=mypkg.rewards:fn` works from the folder that holds `mypkg/`
without PYTHONPATH. `file.py:function` loads that file (its folder is put on the path too, so it
can import its neighbours, as `python file.py` allows).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from rloo.errors import RlooError, StopNow
from rloo.runtime.inputs.names import missing_path_error
from rloo.runtime.signals import sigint_stops_now


def is_file_spec(target: str) -> bool:
    return target.endswith(".py") or "/" in target or os.sep in target


def split_spec(spec: str, what: str) -> tuple[str, str]:
    """'a.b:fn' -> ('a.b', 'fn'); a clear error for anything else."""
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name.isidentifier():
        raise RlooError(f"{what} {spec!r} must be given as module:function or path/to/file.py:function")
    return target, name


def load_callable(spec: str, what: str = "reward function") -> Callable:
    """The callable `spec` names; one RlooError line when the file, module or name is missing."""
    target, name = split_spec(spec, what)
    module = _load_file(target, spec, what) if is_file_spec(target) else _import(target, spec, what)
    # getattr: the user's module: the name is theirs, and may be missing (the error says so)
    fn = getattr(module, name, None)
    if not callable(fn) and _namespace_package(module) and not is_file_spec(target):
        raise RlooError(
            f"{what} {spec!r}: {target!r} is a folder (a namespace package), not a Python module; "
            f"name a module or file in it: {target}.module:{name} or {target}/file.py:{name}"
        )
    if not callable(fn):
        public = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise RlooError(
            f"{what} {spec!r}: {target!r} has no callable {name!r}"
            + (f" (it has: {', '.join(public[:8])})" if public else "")
        )
    return fn


def callable_name(fn: object, default: str) -> str:
    """The name a user's callable (a reward function, a judge, an environment class or factory) is shown
    by in errors and metrics: its __name__, else `default`."""
    # getattr: a user's callable: a functools.partial or a callable object has no __name__
    return getattr(fn, "__name__", default)


def _namespace_package(module) -> bool:
    """Whether an imported module is a folder without __init__.py (a namespace package)."""
    # getattr: a namespace package's module has no __file__ (or None)
    return getattr(module, "__file__", None) is None


def load_module(target: str, what: str = "plugin"):
    """The module `target` names, run on first use: path/to/file.py, or module.name found as
    `python -m` finds it. One RlooError line when it is missing or its code raises."""
    if is_file_spec(target):
        return _load_file(target, target, what)
    if not all(part.isidentifier() for part in target.split(".")):
        raise RlooError(f"{what} {target!r} must be given as path/to/file.py or a module name (my_methods)")
    module = _import(target, target, what, instead="path/to/file.py")
    if _namespace_package(module):  # a folder without __init__.py: it would run nothing
        raise RlooError(
            f"{what} {target!r} is a folder (a namespace package), not a Python module, so it would run "
            f"nothing; name a file in it: {target}/file.py"
        )
    return module


class _ProcessExit(BaseException):
    """os._exit(code) called by the user's module while it loads (`_running_user_code`): a
    BaseException, so that the module's own `except Exception` does not swallow it."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


@contextlib.contextmanager
def _running_user_code():
    """Within this block SIGINT raises StopNow (sigint_stops_now), and os._exit in this process's
    main thread raises _ProcessExit: os._exit ends the process at once, without output or exit
    code of rloo's (a plugin calling os._exit(0) ended `rloo train` silently with 0, nothing
    trained). A process the module forks, or another thread, gets the real os._exit."""
    real, pid = os._exit, os.getpid()

    def refused(code):
        if os.getpid() != pid or threading.current_thread() is not threading.main_thread():
            real(code)
        raise _ProcessExit(code)

    os._exit = refused
    try:
        with sigint_stops_now():
            yield
    finally:
        os._exit = real


def _stopped(e: BaseException, what: str, spec: str) -> BaseException:
    """The line for the user's module that called sys.exit or os._exit or raised KeyboardInterrupt
    itself while loading; a real Ctrl-C (StopNow under `sigint_stops_now`) or any other
    BaseException as it was."""
    if isinstance(e, _ProcessExit):
        return RlooError(
            f"{what} {spec!r} called os._exit({e.code!r}) while loading; it must not end the process (nothing was run)"
        )
    if isinstance(e, StopNow) or not isinstance(e, (SystemExit, KeyboardInterrupt)):
        return e
    if isinstance(e, SystemExit):
        code = "" if e.code is None else repr(e.code)
        return RlooError(f"{what} {spec!r} called sys.exit({code}) while loading; it must not exit (nothing was run)")
    return RlooError(f"{what} {spec!r} raised KeyboardInterrupt while loading (no signal was received)")


def _import(module: str, spec: str, what: str, instead: str = "path/to/file.py:function"):
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)  # what `python -m` does; the rloo CLI entry point does not
    try:
        with _running_user_code():
            return importlib.import_module(module)
    except (SystemExit, KeyboardInterrupt, _ProcessExit) as e:
        raise _stopped(e, what, spec) from None
    except ModuleNotFoundError as e:
        if e.name is not None and module != e.name and not module.startswith(e.name + "."):
            # the module was found; one it imports was not
            raise RlooError(f"{what} {spec!r}: importing {module} raised ModuleNotFoundError: {e}") from e
        raise RlooError(
            f"{what} {spec!r}: cannot import {module!r} from {cwd} or the installed packages "
            f"({e}); give a file instead: {instead}"
        ) from e
    except Exception as e:  # noqa: BLE001 - the user's module failed to run: say which and why, in one line
        raise RlooError(f"{what} {spec!r}: importing {module} raised {type(e).__name__}: {e}") from e


def importable_by_name(module: str) -> bool:
    """Can another process (a spawned one: the asynchronous rollout producer) import `module` by its
    name? Not a module this file loaded from a path (its name is made up here), nor the `__main__`
    of an interactive session; a spawned process runs a script's `__main__` again."""
    if module == "__main__":
        return hasattr(sys.modules["__main__"], "__file__")
    return not module.startswith(_FILE_MODULE_PREFIX)


_FILE_MODULE_PREFIX = "_rloo_user_"


def _load_file(target: str, spec: str, what: str):
    path = Path(target).expanduser().resolve()
    if path.is_dir():
        raise RlooError(
            f"{what} {spec!r}: {target!r} is a folder, not a Python file; name the file: {target.rstrip('/')}/file.py"
        )
    if not path.is_file():
        raise missing_path_error(target, f"{what} file")
    # one module per file: the same file named twice is loaded once
    mod_name = f"{_FILE_MODULE_PREFIX}{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    loader_spec = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[mod_name] = module
    try:
        with _running_user_code():
            loader_spec.loader.exec_module(module)
    except BaseException as e:
        del sys.modules[mod_name]  # a module that did not finish loading is not kept
        if isinstance(e, Exception):  # the user's file failed to run: say where and why, in one line
            raise RlooError(f"{what} {spec!r}: running {target} raised {type(e).__name__}: {e}") from e
        raise _stopped(e, what, spec) from None
    return module
