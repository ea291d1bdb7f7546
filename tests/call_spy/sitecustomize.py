"""Counts calls across processes: Python imports this module at start-up when its folder is on
PYTHONPATH (a subprocess inherits it). With WIDE_TF_CALL_SPY='module:function,...' and
WIDE_TF_CALL_LOG=FILE it wraps each named function in the module that defines it, as soon as that
module has run (before any other module can import the name), and appends one line
'<pid> <module>:<function>' to FILE per call. Used by tests/study/test_process_model.py: each check
runs once per process."""

import functools
import importlib.machinery
import os
import sys

_LOG = os.environ.get("WIDE_TF_CALL_LOG")
_WANTED: dict[str, list[str]] = {}
for _item in filter(None, os.environ.get("WIDE_TF_CALL_SPY", "").split(",")):
    _module, _function = _item.split(":")
    _WANTED.setdefault(_module, []).append(_function)


def _wrap(module, name: str) -> None:
    original = getattr(module, name, None)
    if original is None:  # not in this version of the module: nothing to count
        return

    @functools.wraps(original)
    def spied(*args, **kwargs):
        with open(_LOG, "a") as f:
            f.write(f"{os.getpid()} {module.__name__}:{name}\n")
        return original(*args, **kwargs)

    setattr(module, name, spied)


class _Finder:
    """Finds nothing itself: wraps the loader of a wanted module so the wrapping follows its run."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _WANTED:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            for name in _WANTED[fullname]:
                _wrap(module, name)

        spec.loader.exec_module = exec_module
        return spec


if _LOG and _WANTED:
    sys.meta_path.insert(0, _Finder())
