"""torch, imported when first used rather than when tunelab's modules load.

Importing torch takes about five seconds on a GPU host. A lane worker needs it
and pays once; a compile worker only runs Triton's compiler and must not pay it
at all, yet it loads the same problem and kernel modules. So those modules
write `from tunelab.lazy import torch` and the import happens at the first
attribute access, which a compile worker never makes.
"""

import importlib
from typing import TYPE_CHECKING


class LazyModule:
    def __init__(self, name: str):
        self.__dict__["_name"] = name
        self.__dict__["_module"] = None

    def _load(self):
        module = self.__dict__["_module"]
        if module is None:
            module = importlib.import_module(self.__dict__["_name"])
            self.__dict__["_module"] = module
        return module

    def __getattr__(self, attr):
        return getattr(self._load(), attr)

    def __repr__(self):
        state = "loaded" if self.__dict__["_module"] is not None else "not loaded yet"
        return f"<lazy module {self.__dict__['_name']!r}, {state}>"


if TYPE_CHECKING:
    # Type checkers see the module itself.
    import torch as torch
else:
    torch = LazyModule("torch")
