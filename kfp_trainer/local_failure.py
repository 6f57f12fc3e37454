"""How a failed ``kfp-trainer run --local`` ends: the failing step's name and its error, in one block.

``kfp.local`` streams each task's output to stdout and, when a task fails, raises a
``RuntimeError`` that names the pipeline and the chain of failed tasks (with terminal colours)
-- the step's actual error is somewhere above, among its log lines. :class:`TaskLog` tees
stdout while the pipeline runs and keeps the tail of each task's output; :func:`failure_block`
turns kfp's error and that tail into one block: which step failed and what it said
(``[kfp-trainer] error: ...`` of this package's steps, else the exception of a Python
traceback, else the last lines of the step's log).

Example:
    >>> error = RuntimeError("Pipeline 'p' finished with status FAILURE. Inner task failed: 'train' inside 'for-loop-2'.")
    >>> log = ["    Traceback (most recent call last):", '      File "x.py", line 1', "    ValueError: bad"]
    >>> print(failure_block(error, {"train": log}))
    error: step 'train' (inside 'for-loop-2') of pipeline 'p' failed:
        ValueError: bad
"""

from __future__ import annotations

import io
import re
from collections import deque
from typing import Any, TextIO

from .redaction import redact_formats, redact_text

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_EXECUTING = re.compile(r"Executing task '([^']+)'")
_CHAIN = re.compile(r"Inner task failed: (.+?)\.?\s*$")
_ONE_TASK = re.compile(r"Task '([^']+)' finished with status FAILURE")
_PIPELINE = re.compile(r"Pipeline '([^']+)' finished with status FAILURE")
_OURS = "[kfp-trainer] error: "
_STEP_INDENT = "    "
TAIL_LINES = 400
BLOCK_LINES = 40


def is_step_failure(error: BaseException) -> bool:
    """Whether ``error`` is kfp.local saying a task failed (rather than a problem with the pipeline itself)."""
    text = ANSI.sub("", str(error))
    return isinstance(error, RuntimeError) and "finished with status FAILURE" in text


class TaskLog(io.TextIOBase):
    """A stdout stand-in that passes everything on and keeps the last lines of each kfp.local task.

    Args:
        stream: Where the text goes (the real stdout).
        keep: Lines kept per task.
    """

    def __init__(self, stream: TextIO, keep: int = TAIL_LINES) -> None:
        super().__init__()
        self.stream = stream
        self.keep = keep
        self.tails: dict[str, deque[str]] = {}
        self.last_task: str | None = None
        self._partial = ""

    def write(self, text: str) -> int:
        """Pass ``text`` on and file its complete lines under the task that is running."""
        self.stream.write(text)
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        for line in lines:
            self._line(line)
        return len(text)

    def flush(self) -> None:
        """Flush the real stream."""
        self.stream.flush()

    def isatty(self) -> bool:
        """Whether the real stream is a terminal (kfp and tqdm ask)."""
        return self.stream.isatty()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        """The real stream's encoding."""
        return getattr(self.stream, "encoding", "utf-8")

    def fileno(self) -> int:
        """The real stream's file descriptor (child processes inherit it)."""
        return self.stream.fileno()

    def _line(self, raw: str) -> None:
        line = ANSI.sub("", raw)
        started = _EXECUTING.search(line)
        if started:
            self.last_task = started.group(1)
            self.tails[self.last_task] = deque(maxlen=self.keep)
        elif self.last_task is not None and (line.startswith(_STEP_INDENT) or not line.strip()):
            self.tails[self.last_task].append(line)  # kfp.local indents a step's output; its own log lines are not


def failed_tasks(error: BaseException) -> tuple[str, list[str]]:
    """The pipeline's name and the chain of failed tasks (innermost first) from kfp.local's error."""
    text = ANSI.sub("", str(error))
    pipeline = _PIPELINE.search(text)
    chain = _CHAIN.search(text)
    if chain:
        tasks = [name.strip().strip("'\"") for name in chain.group(1).split(" inside ")]
    else:
        one = _ONE_TASK.search(text)
        tasks = [one.group(1)] if one else []
    return (pipeline.group(1) if pipeline else ""), tasks


def step_error(lines: list[str]) -> list[str]:
    """What a step's output says went wrong: its ``[kfp-trainer] error``, else its exception, else its last lines."""
    lines = _dedent([line.rstrip() for line in lines])
    while lines and not lines[-1].strip():
        lines.pop()
    ours = [i for i, line in enumerate(lines) if line.lstrip().startswith(_OURS)]
    if ours:
        found = lines[ours[-1] :]
        found[0] = found[0].lstrip()[len("[kfp-trainer] ") :]
        return found
    tracebacks = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last):")]
    if tracebacks:
        rest = lines[tracebacks[-1] + 1 :]
        start = next((i for i, line in enumerate(rest) if line and not line[0].isspace()), None)
        if start is not None:
            return rest[start:]
    return [line for line in lines if line.strip()][-15:]


def failure_block(error: BaseException, tails: dict[str, Any], last_task: str | None = None) -> str:
    """One block for a failed local run: the failing step (and where it sits) and its error."""
    pipeline, tasks = failed_tasks(error)
    task = tasks[0] if tasks else (last_task or "?")
    tail = tails.get(task)
    if tail is None and last_task is not None:
        tail = tails.get(last_task)
    where = f" (inside {', inside '.join(repr(t) for t in tasks[1:])})" if len(tasks) > 1 else ""
    head = f"error: step {task!r}{where}" + (f" of pipeline {pipeline!r}" if pipeline else "") + " failed"
    said = step_error(list(tail or []))
    if not said:
        return head + " (it printed nothing)"
    if len(said) > BLOCK_LINES:
        said = said[: BLOCK_LINES - 1] + [f"... ({len(said) - BLOCK_LINES + 1} more lines in the step's log above)"]
    ours = bool(said) and said[0].startswith("error: ")
    return head + ":\n" + "\n".join("    " + (_shown(line) if ours else redact_text(line)) for line in said)


# A refusal as this package words it: ``field: got <value>; expected <what to do>``.
_REFUSAL = re.compile(r"(?:error: |\s*- )?.+?: got .*?; expected ")


def _shown(line: str) -> str:
    """A line of this package's own error, redacted unless it is a refusal, which was made safe to show.

    A refusal reads ``field: got <value>; expected <what to do>``: the value was hidden or
    scrubbed when the step made the message, the field is an input's name, and the advice is
    this package's own text, which names secrets without holding any (``HF_TOKEN -- take it
    from a Secret``, ``secret_key_to_env={'hf_token': 'HF_TOKEN'}``). Masking it again made
    nonsense of it (``credentials: *** a Secret``): only credential formats are masked in it
    (URIs with a password, tokens). Other lines (a failed job's diagnosis, its log tail) are
    redacted in full.

    Example:
        >>> _shown("  - hf_token: got '<hidden>'; expected a URI without credentials: name a Secret")
        "  - hf_token: got '<hidden>'; expected a URI without credentials: name a Secret"
        >>> _shown("last log lines: HF_TOKEN=hf_abc")
        'last log lines: HF_TOKEN=***'
    """
    return redact_formats(line) if _REFUSAL.match(line) else redact_text(line)


def _dedent(lines: list[str]) -> list[str]:
    """Lines without the indentation kfp.local gives a task's output (the smallest common one)."""
    widths = [len(line) - len(line.lstrip(" ")) for line in lines if line.strip()]
    cut = min(widths, default=0)
    return [line[cut:] for line in lines]
