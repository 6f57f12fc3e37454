r"""Record shapes: which columns a dataset's records have, and how they become prompt and completion.

A file's shape is chosen once from its columns, the first that fits, in this order:

* ``prompt_completion``: ``prompt`` and ``completion`` columns, used as they are (text, or
  numbers written as text). Either may also be a list of chat messages (the conversational
  prompt/completion form): the prompt is rendered like a chat, the completion is the text
  of its assistant messages.
* ``chat``: a ``messages`` (or ``conversations``) column holding a list of turns
  ``{"role": ..., "content": ...}`` (or ShareGPT's ``{"from": "human"|"gpt", "value": ...}``).
  The completion is the last assistant turn; the prompt is every turn before it, rendered with
  the model's tokenizer chat template when it has one, else with :data:`CHAT_TURN` per turn
  followed by :data:`CHAT_GENERATION` (later turns are dropped).
* ``instruction``: ``instruction`` and ``output`` (or ``response``) columns, with an optional
  ``input`` (or ``context``) column: Alpaca and Dolly style. The prompt is
  :data:`ALPACA_PROMPT` when the input is not empty, else :data:`ALPACA_PROMPT_NO_INPUT`;
  the completion is the output.
* ``question_answer``: ``question`` and ``answer`` columns: prompt ``"Question: {question}\nAnswer: "``.
* ``input_output``: ``input`` and ``output`` columns (no instruction), used as they are.
* ``preference``: ``prompt``, ``chosen`` and ``rejected`` columns (a preference pair, what DPO
  trains on: :mod:`kfp_trainer.data.preference`); read for supervised fine-tuning it is the
  prompt with the chosen answer as its completion.

Other columns are ignored. The learned tokens are the completion's, followed by the tokenizer's
end-of-sequence token. Errors name the row and the column, never a value.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from .files import DatasetError

#: Alpaca prompt for a record with a non-empty input.
ALPACA_PROMPT = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
)
#: Alpaca prompt for a record without input.
ALPACA_PROMPT_NO_INPUT = (
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:\n"
)
QUESTION_PROMPT = "Question: {question}\nAnswer: "
#: One chat turn, when the tokenizer has no chat template.
CHAT_TURN = "<|{role}|>\n{content}\n"
#: What follows the turns of a chat prompt, when the tokenizer has no chat template.
CHAT_GENERATION = "<|assistant|>\n"

#: The accepted shapes, for error messages and documentation.
ACCEPTED = (
    "prompt+completion",
    "messages (or conversations): list of {role, content}",
    "instruction+output (optional input; or instruction+response, optional context)",
    "question+answer",
    "input+output",
    "prompt+chosen+rejected (a preference pair; for SFT the chosen answer is the completion)",
)

_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "bot": "assistant",
          "model": "assistant", "system": "system"}  # fmt: skip

ChatRenderer = Callable[[list[dict[str, str]]], str]


def detect_shape(columns: list[str] | set[str]) -> str | None:
    """The shape of records with these columns, or ``None`` if none fits.

    Example:
        >>> detect_shape(["instruction", "input", "output", "text"]), detect_shape(["messages"]), detect_shape(["text"])
        ('instruction', 'chat', None)
    """
    cols = set(columns)
    if {"prompt", "completion"} <= cols:
        return "prompt_completion"
    if {"prompt", "chosen", "rejected"} <= cols:
        return "preference"
    if cols & {"messages", "conversations"}:
        return "chat"
    if "instruction" in cols and cols & {"output", "response"}:
        return "instruction"
    if {"question", "answer"} <= cols:
        return "question_answer"
    if {"input", "output"} <= cols:
        return "input_output"
    return None


def render_simple_chat(messages: list[dict[str, str]]) -> str:
    r"""A chat prompt without a tokenizer template: :data:`CHAT_TURN` per turn, then :data:`CHAT_GENERATION`.

    Example:
        >>> render_simple_chat([{"role": "user", "content": "Hi"}])
        '<|user|>\nHi\n<|assistant|>\n'
    """
    return "".join(CHAT_TURN.format(role=m["role"], content=m["content"]) for m in messages) + CHAT_GENERATION


def chat_renderer(tokenizer: Any) -> ChatRenderer | None:
    """A renderer that uses ``tokenizer``'s chat template, or ``None`` when it has none.

    The rendered prompt ends with the template's generation prompt (the assistant's header).
    A leading BOS token is dropped from the text, since the prompt is tokenized with special
    tokens and would get a second one.

    Args:
        tokenizer: A Hugging Face tokenizer (anything with ``chat_template`` and ``apply_chat_template``).
    """
    if not getattr(tokenizer, "chat_template", None):
        return None
    bos = getattr(tokenizer, "bos_token", None)

    def render(messages: list[dict[str, str]]) -> str:
        text = str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
        return text[len(bos) :] if bos and text.startswith(bos) else text

    return render


def _text(row: Mapping[str, Any], column: str, where: str, *, optional: bool = False) -> str:
    value = row.get(column)
    if value is None and optional:
        return ""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        kind = "missing" if value is None else f"a {type(value).__name__}"
        raise DatasetError(f"{where}: column {column!r} is {kind}; expected text")
    return str(value)


def _turns(value: Any, where: str, column: str) -> list[dict[str, str]]:
    if isinstance(value, str) and value.lstrip().startswith("["):  # a chat stored as JSON text (csv)
        try:
            value = json.loads(value)
        except ValueError:
            raise DatasetError(f"{where}: column {column!r} is not a valid JSON list of turns") from None
    if not isinstance(value, list) or not value:
        raise DatasetError(f"{where}: column {column!r} must be a non-empty list of {{role, content}} turns")
    turns = []
    for i, turn in enumerate(value):
        if not isinstance(turn, Mapping):
            raise DatasetError(f"{where}: {column}[{i}] is a {type(turn).__name__}; expected {{role, content}}")
        role = turn.get("role", turn.get("from"))
        content = turn.get("content", turn.get("value"))
        if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}]
            parts = [p.get("text") for p in content if isinstance(p, Mapping)]
            content = "".join(p for p in parts if isinstance(p, str)) if all(isinstance(p, str) for p in parts) else None
        if not isinstance(role, str) or not isinstance(content, str):
            raise DatasetError(f"{where}: {column}[{i}] needs a text role/from and content/value")
        turns.append({"role": _ROLES.get(role.lower(), role.lower()), "content": content})
    return turns


def _chat(turns: list[dict[str, str]], where: str, column: str, render: ChatRenderer) -> dict[str, str]:
    last = max((i for i, t in enumerate(turns) if t["role"] == "assistant"), default=None)
    if last is None:
        raise DatasetError(f"{where}: column {column!r} has no assistant turn to learn")
    return {"prompt": render(turns[:last]), "completion": turns[last]["content"]}


def _conversational(row: Mapping[str, Any], where: str, render: ChatRenderer) -> dict[str, str]:
    """A prompt/completion record whose prompt or completion is a list of chat turns."""
    prompt, completion = row.get("prompt"), row.get("completion")
    if isinstance(prompt, list):
        turns = _turns(prompt, where, "prompt")
    else:
        turns = [{"role": "user", "content": _text(row, "prompt", where)}]
    if isinstance(completion, list):
        text = "".join(t["content"] for t in _turns(completion, where, "completion") if t["role"] == "assistant")
    else:
        text = _text(row, "completion", where)
    return {"prompt": render(turns), "completion": text}


def to_example(row: Mapping[str, Any], shape: str, where: str, render: ChatRenderer | None = None) -> dict[str, str]:
    """One record as ``{"prompt": ..., "completion": ...}``.

    Args:
        row: The record.
        shape: Its file's shape, from :func:`detect_shape`.
        where: The file and row, for error messages.
        render: Chat prompt renderer (:func:`chat_renderer`); default :func:`render_simple_chat`.

    Raises:
        DatasetError: A column the shape needs is missing or of the wrong type.
    """
    render = render or render_simple_chat
    if shape == "prompt_completion":
        prompt, completion = row.get("prompt"), row.get("completion")
        if isinstance(prompt, list) or isinstance(completion, list):
            return _conversational(row, where, render)
        return {"prompt": _text(row, "prompt", where), "completion": _text(row, "completion", where)}
    if shape == "chat":
        column = "messages" if "messages" in row else "conversations"
        return _chat(_turns(row.get(column), where, column), where, column, render)
    if shape == "instruction":
        output = "output" if row.get("output") is not None or "response" not in row else "response"
        context = "input" if row.get("input") is not None or "context" not in row else "context"
        instruction, extra = _text(row, "instruction", where), _text(row, context, where, optional=True)
        template = ALPACA_PROMPT if extra.strip() else ALPACA_PROMPT_NO_INPUT
        return {"prompt": template.format(instruction=instruction, input=extra), "completion": _text(row, output, where)}
    if shape == "question_answer":
        return {"prompt": QUESTION_PROMPT.format(question=_text(row, "question", where)), "completion": _text(row, "answer", where)}
    if shape == "input_output":
        return {"prompt": _text(row, "input", where), "completion": _text(row, "output", where)}
    if shape == "preference":
        pair = to_pair(row, where, render)
        return {"prompt": pair["prompt"], "completion": pair["chosen"]}
    raise ValueError(f"unknown shape {shape!r}")


def _answer(row: Mapping[str, Any], column: str, where: str) -> str:
    value = row.get(column)
    if isinstance(value, list):  # conversational: the assistant turns are the answer
        return "".join(t["content"] for t in _turns(value, where, column) if t["role"] == "assistant")
    return _text(row, column, where)


def to_pair(row: Mapping[str, Any], where: str, render: ChatRenderer | None = None) -> dict[str, str]:
    r"""A preference record as ``{"prompt": ..., "chosen": ..., "rejected": ...}`` texts.

    The prompt is text, or a list of chat turns rendered like a chat prompt; ``chosen`` and
    ``rejected`` are text, or lists of turns whose assistant turns are the answer (TRL's
    conversational preference form).

    Example:
        >>> to_pair({"prompt": "1+1=", "chosen": "2", "rejected": 3}, "r1")
        {'prompt': '1+1=', 'chosen': '2', 'rejected': '3'}
        >>> to_pair({"prompt": [{"role": "user", "content": "Hi"}], "chosen": [{"role": "assistant", "content": "Hello"}],
        ...          "rejected": "Go away"}, "r2")["prompt"]
        '<|user|>\nHi\n<|assistant|>\n'

    Raises:
        DatasetError: A column is missing or of the wrong type (named with the row, never its value).
    """
    render = render or render_simple_chat
    prompt = row.get("prompt")
    text = render(_turns(prompt, where, "prompt")) if isinstance(prompt, list) else _text(row, "prompt", where)
    return {"prompt": text, "chosen": _answer(row, "chosen", where), "rejected": _answer(row, "rejected", where)}
