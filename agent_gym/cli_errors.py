"""The one place where a command's errors become one line (a bad input never ends in a traceback).

Every console script (``agent-gym-train``, ``-train-ppo``, ``-train-grpo``, ``-sft``, ``-eval``,
``-serve``, ``-retrieval-server``, ``-view``) and every ``python trainers/*.py`` / ``python -m
agent_gym.*`` entry runs its ``main`` through :func:`run_main` (the :func:`command` decorator does it
when ``main`` is called without ``argv``, that is from the command line). A bad input then ends as

    error: <what is wrong>; <what to type instead>

on stderr (one line) with exit status 2, never a traceback. The known errors (:func:`describe`) are
the project's own (:class:`UserError` and its subclasses: ``ConfigError``, ``ModelLoadError``, the
dataset errors, ...; ``SystemExit("error: ...")``; a ``ValueError`` or ``ImportError`` that the
project's code raises itself, a check's message or an install hint), a missing or unreadable file or
directory, bad YAML, an unknown env id (Gymnasium's lookup errors) and Ctrl-C (exit 130). Anything
else is a bug and keeps its traceback. ``--debug`` anywhere on the command line (taken out before the
command parses it) or ``AGENT_GYM_DEBUG=1`` shows the traceback of the known errors too, before their
line. The trainers' own statuses stay: 3 a non-finite loss, 4 a run whose files could not be written
(``trainers/cli.py``).

A message that names Python (``load_qa(..., data_path=...)``) for a Python user says the flag on the
command line: ``UserError.for_command_line(env_kwargs)``, where ``env_kwargs`` is how the running
command takes env arguments (:data:`ENV_KWARGS_FLAG`, :data:`TRAIN_ENV_KWARGS`, :data:`SFT_ENV_KWARGS`).

Argument errors go through :class:`ArgumentParser`, whose ``error`` prints one line (argparse's own
prints the whole usage first, many lines for a command with many flags) and exits 2 as argparse does.

Torch-free and free of ``envs``/``trainers`` imports (the layers: docs/design.md), so the env-side
commands use it as the trainers do.
"""

from __future__ import annotations

import argparse
import difflib
import errno
import functools
import inspect
import os
import sys
import traceback
from typing import Any, Callable

import gymnasium
from gymnasium.envs import registration as gym_registration

from agent_gym.env_ids import ENV_IDS

DEBUG_ENV = "AGENT_GYM_DEBUG"
DEBUG_FLAG = "--debug"
EPILOG = (
    "A bad input prints one line, 'error: <what is wrong>; <what to type instead>', and exits with status 2; "
    f"{DEBUG_FLAG} (or {DEBUG_ENV}=1) shows the traceback."
)

ENV_KWARGS_FLAG = "--env-kwargs '{{{}}}'"
"""How ``agent-gym-eval`` and ``agent-gym-serve`` take env arguments: ``ENV_KWARGS_FLAG.format("data_path: F")``."""
TRAIN_ENV_KWARGS = (
    "rollout: {{env_kwargs: {{{}}}}} in the config (an override rollout.env_kwargs='{{...}}' replaces the "
    "whole mapping)"
)
SFT_ENV_KWARGS = "env_kwargs: {{{}}} in the config (an override env_kwargs='{{...}}' replaces the whole mapping)"


class UserError(Exception):
    """Base of the project's errors that are the user's to fix (a path, a name, a config value); the
    message says what is wrong and what to pass instead. A command prints it as one line and exits 2
    (:func:`run_main`). Mixed into ``ConfigError``, ``ModelLoadError``, ``DatasetDownloadError``, ...,
    which keep their other bases (``ValueError``, ``RuntimeError``) for ``except`` clauses."""

    def for_command_line(self, env_kwargs: str = ENV_KWARGS_FLAG) -> str:
        """The message for a command-line user; ``env_kwargs`` is how the running command takes env
        arguments (a format with one ``{}``, e.g. :data:`ENV_KWARGS_FLAG`). The default is ``str(self)``;
        an error whose Python message names Python (``load_qa(..., data_path=...)``) says the flag here."""
        return str(self)


class UsageError(UserError, ValueError):
    """A user error where no more specific class exists (a ``ValueError``, as such checks raised before)."""


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are one line, ``error: <message>; see <prog> --help``,
    with argparse's exit status 2 (subparsers made by ``add_subparsers`` are of this class too), and
    whose help ends with :data:`EPILOG` (the ``--debug`` rule) unless it has an epilog of its own."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("epilog", EPILOG)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"error: {_one_line(message)}; see {self.prog} --help\n")


def prog_name(default: str, argv: Any = None, module: str | None = None) -> str:
    """What the user typed to run the command, for usage lines: ``agent-gym-train-ppo`` (a console
    script), ``train_ppo.py`` (``python trainers/train_ppo.py``), ``python -m agent_gym.serve`` (when
    ``module`` is the one ``-m`` ran); ``default`` when ``main`` is called from Python with ``argv``."""
    if argv is not None:
        return default
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if module is not None and spec is not None and spec.name == module:
        return f"python -m {module}"
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return name if name and name not in ("-c", "-m", "__main__.py") else default


def debug_requested() -> bool:
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


def take_debug_flag(argv: list[str]) -> bool:
    """Remove every ``--debug`` before a ``--`` from ``argv`` (in place); whether there was one."""
    end = argv.index("--") if "--" in argv else len(argv)
    found = DEBUG_FLAG in argv[:end]
    if found:
        argv[:end] = [a for a in argv[:end] if a != DEBUG_FLAG]
    return found


def run_main(main: Callable[[], Any], env_kwargs: str = ENV_KWARGS_FLAG) -> int:
    """Run ``main()`` (it parses ``sys.argv``) and return the exit status: its own (``None`` is 0), 2
    with one line on stderr for a known error (:func:`describe`), 130 for Ctrl-C. ``--debug`` is taken
    out of ``sys.argv`` first; with it (or ``AGENT_GYM_DEBUG=1``) the traceback of a known error comes
    before its line (the status stays). An unknown error (a bug) is raised again: its traceback, exit 1."""
    if take_debug_flag(sys.argv):
        os.environ[DEBUG_ENV] = "1"  # also for a nested run_main and the command's child processes
    try:
        rc = main()
    except SystemExit as e:
        if not isinstance(e.code, str):  # sys.exit(n), argparse's exits: as they are
            raise
        return report(_strip_error(e.code), 2)
    except KeyboardInterrupt:
        return report("interrupted (Ctrl-C)", 130)
    except Exception as e:
        message = describe(e, env_kwargs)
        if message is None:
            raise
        return report(message, 2)
    return 0 if rc is None else int(rc)


def report(message: str, status: int = 2) -> int:
    """Print ``error: <message>`` as one line on stderr (after the traceback of the exception being
    handled, under ``--debug``/``AGENT_GYM_DEBUG=1``); return ``status``. For a command's own
    ``except`` clauses too, so that they follow the same rule."""
    if debug_requested() and sys.exc_info()[0] is not None:
        traceback.print_exc()
    print(f"error: {_one_line(message)}", file=sys.stderr)
    return status


def command(main: Callable | None = None, *, env_kwargs: str = ENV_KWARGS_FLAG) -> Callable:
    """Decorator for a command's ``main(..., argv=None)``: called without ``argv`` (a console script,
    ``python path/to/script.py``, ``python -m ...``) it runs under :func:`run_main` and returns the exit
    status; called from Python with ``argv`` it is the plain function (errors raise, as before)."""

    def wrap(f: Callable) -> Callable:
        sig = inspect.signature(f)

        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if sig.bind(*args, **kwargs).arguments.get("argv") is not None:
                return f(*args, **kwargs)
            return run_main(lambda: f(*args, **kwargs), env_kwargs)

        return wrapper

    return wrap(main) if main is not None else wrap


def describe(e: BaseException, env_kwargs: str = ENV_KWARGS_FLAG) -> str | None:
    """The one-line message for a known error, ``None`` for any other (its traceback is shown)."""
    if isinstance(e, UserError):
        return e.for_command_line(env_kwargs)
    yaml = sys.modules.get("yaml")
    if yaml is not None and isinstance(e, yaml.YAMLError):
        return yaml_message(e)
    gym_error = sys.modules.get("gymnasium.error")
    if gym_error is not None and isinstance(e, gym_error.Error):
        if isinstance(e, (gym_error.UnregisteredEnv, gym_error.DeprecatedEnv)) or "environment id" in str(e).lower():
            return f"unknown env id ({_one_line(str(e)).rstrip('.')}); {registered_ids_hint()}"
        return None
    if isinstance(e, (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError)):
        return os_error_message(e)
    if isinstance(e, (ValueError, ImportError)) and raised_by_project(e):  # a check's message, an install hint
        return f"{e} ({DEBUG_FLAG} shows where)"
    return None


PROJECT_DIRS = tuple(
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), pkg) + os.sep
    for pkg in ("agent_gym", "envs", "trainers")
)


def raised_by_project(e: BaseException) -> bool:
    """Whether the project's own code raised ``e`` with a ``raise`` statement (its check of an input
    or an install hint, with a message for the user), not Python or a library (``int('x')``, an
    unpacking, numpy, a module that is not installed): the
    innermost frame is in ``agent_gym/``, ``envs/`` or ``trainers/`` and its line is a ``raise``."""
    frames = traceback.extract_tb(e.__traceback__)
    if not frames:
        return False
    last = frames[-1]
    return last.filename.startswith(PROJECT_DIRS) and (last.line or "").lstrip().startswith("raise ")


def os_error_message(e: OSError) -> str:
    """``[Errno 2] No such file or directory: 'x'`` as ``no such file or directory: 'x'; pass ...``; a
    project message (no errno) as it is, with the same fix."""
    what = f"{e.strerror[0].lower()}{e.strerror[1:]}: {e.filename!r}" if e.strerror and e.filename else str(e)
    if isinstance(e, PermissionError):
        return f"{what}; pass a path you may read (and write, for an output), or fix its permissions"
    if isinstance(e, IsADirectoryError) or e.errno == errno.EISDIR:
        return f"{what}; pass a file there, not a directory"
    if isinstance(e, NotADirectoryError) or e.errno == errno.ENOTDIR:
        return f"{what}; pass a directory there, not a file"
    return f"{what}; check the path (relative paths start at {os.getcwd()}) and pass an existing one"


def yaml_message(e: Exception, source: str | None = None) -> str:
    """Bad YAML as one line: where (``source``, else the file YAML names), what, and the fix."""
    mark = getattr(e, "problem_mark", None)
    name = source or (mark.name if mark is not None and not str(mark.name).startswith("<") else None)
    problem = getattr(e, "problem", None) or _one_line(str(e))
    context = getattr(e, "context", None)
    at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    what = f"{name} is not valid YAML" if name else "a value is not valid YAML"
    return (
        f"{what}: {problem}{f' ({context})' if context else ''}{at}; fix the YAML there (key: value "
        "mappings, lists as [a, b]; quote strings that hold ': ')"
    )


def config_yaml_message(e: Exception, config: str | None, overrides: list[str] = ()) -> str:
    """:func:`yaml_message` for a training command's bad YAML: the first ``key=value`` override whose
    value is not YAML, else the config file ``config``."""
    import yaml  # deferred: yaml (~20 ms) stays out of `import agent_gym` and every command's --help

    for item in overrides:
        try:
            yaml.safe_load(item.partition("=")[2])
        except yaml.YAMLError:
            return f"{yaml_message(e, f'override {item!r}')} (quote the value: key='...')"
    return yaml_message(e, config)


def check_env_id(env_id: str, flag: str = "--env") -> None:
    """Raise :class:`UsageError` naming ``flag`` when Gymnasium has no env ``env_id`` (before a model
    is loaded for it); ``agent_gym`` and the plugins must be imported first."""
    find = getattr(gym_registration, "_find_spec", gymnasium.spec)  # gym.make's own lookup: "module:id", no version
    try:
        find(env_id)
    except gymnasium.error.Error as e:
        raise UsageError(f"{flag} {env_id!r} is not a registered env id; {registered_ids_hint(env_id)}") from e


def registered_ids_hint(env_id: str | None = None) -> str:
    """``pass a registered id ...``: the closest of the ids ``agent_gym`` registered (built-in and
    plugins) to ``env_id``, and the list."""
    ids = sorted(ENV_IDS)
    names = {i.rpartition("/")[2].lower(): i for i in ids}  # compared without the namespace they share
    close = difflib.get_close_matches(env_id.rpartition("/")[2].lower(), names, n=1, cutoff=0.7) if env_id else []
    first = f"did you mean {names[close[0]]}? " if close else ""
    return f"{first}pass a registered id, e.g. AgentR1/FactChain-v0" + (
        f" (registered: {', '.join(ids)})" if ids else ""
    )


def _strip_error(message: str) -> str:
    message = message.strip()
    return message[len("error:") :].strip() if message.lower().startswith("error:") else message


def _one_line(message: str) -> str:
    return " ".join(str(message).split())


__all__ = [
    "ArgumentParser",
    "DEBUG_ENV",
    "check_env_id",
    "config_yaml_message",
    "DEBUG_FLAG",
    "ENV_KWARGS_FLAG",
    "EPILOG",
    "SFT_ENV_KWARGS",
    "TRAIN_ENV_KWARGS",
    "UsageError",
    "UserError",
    "command",
    "debug_requested",
    "describe",
    "prog_name",
    "report",
    "run_main",
    "take_debug_flag",
]
