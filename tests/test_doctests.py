"""The runnable examples in tdag's docstrings stay true."""
from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import tdag

MODULES = sorted(m.name for m in pkgutil.walk_packages(tdag.__path__, "tdag.")
                 if not m.name.endswith(("__main__", ".demo")))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
