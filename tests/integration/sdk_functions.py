"""Training functions of the CustomTrainer comparisons, read by both sides from this one file.

The kubeflow SDK (in its own virtualenv, hack/sdk/interop_driver.py) and the interop tests
load this file by path, so ``inspect.getsource`` and the file name are the same for both. It
imports nothing from kfp-trainer or the test suite: the SDK's virtualenv has neither.
"""

from __future__ import annotations

import functools


def traced(func):
    """A decorator as users write them (``functools.wraps``): the SDK keeps its line in the source."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        print(f"calling {func.__name__}")
        return func(*args, **kwargs)

    return wrapper


def no_parameters():
    """Takes nothing: the SDK calls it as ``no_parameters()``."""
    import os

    print("rank", os.environ.get("RANK", "0"))


def module_names(steps: int = 10, inputs: str = "data", kfp: int = 1, dsl: str = "d", os: str = "o", sys: bool = False,
                 json: dict = None, self: float = 0.5, values: list = None, module: str = "m"):  # fmt: skip
    """Parameters named like modules and variables a generated component might use itself."""
    print(steps, inputs, kfp, dsl, os, sys, json, self, values, module)


@traced
def decorated(lr: float = 0.1, epochs: int = 2):
    """A decorated function: its source starts with the decorator."""
    print(lr, epochs)


def unannotated(lr=0.01, epochs=3, name="run", verbose=False):
    """No annotations: the component takes each parameter's type from its default."""
    print(lr, epochs, name, verbose)


def keyword_only(*, lr: float = 0.1, tags: list = None):
    """Keyword-only parameters: the call by keywords reaches them."""
    print(lr, tags)


def with_kwargs(lr: float = 0.1, **extra):
    """``**extra`` takes no component input."""
    print(lr, extra)


def quoting(message: str = "it's \"quoted\" $HOME `x` {braces}", table: dict = None):
    """Values with quotes, shell characters and braces, carried in the command's here-document."""
    print(message, table)
