"""Run-time work of ``trainjob_component``: the TrainJob command that runs a shipped Python function."""

from __future__ import annotations

import base64
import json
from typing import Any

BOOTSTRAP = """\
import base64, json, os, sys, tempfile
source, function, arguments, launch = base64.b64decode(sys.argv[1]).decode(), sys.argv[2], sys.argv[3], sys.argv[4]
path = os.path.join(tempfile.mkdtemp(prefix="kfp-trainer-"), "trainjob_function.py")
with open(path, "w") as f:
    f.write(source + "\\n\\nif __name__ == '__main__':\\n    import json, sys\\n    " + function + "(**json.loads(sys.argv[1]))\\n")
if launch == "torchrun" and os.environ.get("PET_NNODES"):
    os.execv(sys.executable, [sys.executable, "-m", "torch.distributed.run", path, arguments])
os.execv(sys.executable, [sys.executable, path, arguments])
"""


def function_command(source: str, function: str, arguments: dict[str, Any], *, torchrun: bool) -> list[str]:
    """The TrainJob command that runs ``function`` from ``source`` with ``arguments``.

    Example:
        >>> function_command("def f(): pass", "f", {}, torchrun=False)[:2]
        ['python', '-c']
    """
    encoded = base64.b64encode(source.encode()).decode()
    return ["python", "-c", BOOTSTRAP, encoded, function, json.dumps(arguments, sort_keys=True), "torchrun" if torchrun else "plain"]
