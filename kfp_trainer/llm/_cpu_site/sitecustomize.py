"""Start-up hook of local torchtune runs: applies kfp_trainer.llm.cpu_compat, then any other sitecustomize.

Only on PYTHONPATH for trainer processes that the local backend starts.
"""

import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))

try:
    from kfp_trainer.llm import cpu_compat

    for _line in cpu_compat.apply_from_env():
        if os.environ.get("RANK", "0") == "0" and os.environ.get("LOCAL_RANK") is not None:
            print(f"[kfp-trainer cpu-compat] {_line}", file=sys.stderr, flush=True)
finally:
    # Chain to the sitecustomize this one shadows, if the interpreter has one.
    _rest = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    _spec = importlib.machinery.PathFinder.find_spec("sitecustomize", _rest)
    if _spec is not None and _spec.loader is not None:
        _module = importlib.util.module_from_spec(_spec)
        _spec.loader.exec_module(_module)
