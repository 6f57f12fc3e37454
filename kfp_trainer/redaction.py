"""What looks like a secret, and how to show a value without it. Pure: standard library only.

One helper for every place that shows user-given text: validation errors, log lines, the
report, artifact metadata. Two kinds of evidence are used:

* **the name**: a variable, key or command-line flag whose name says it holds a credential
  (``HF_TOKEN``, ``hf-token``, ``HFTOKEN``, ``hf.token``, ``hfToken``, ``AWS_SECRET_ACCESS_KEY``,
  ``AZURE_STORAGE_CONNECTION_STRING``, ``GOOGLE_API_KEY``, ``DB_PASSWORD_2``, ...), see
  :func:`is_secret_name`;
* **the value**: credentials in a URI (``s3://key:secret@bucket``), well-known token formats
  (Hugging Face, AWS access key ids, GitHub, Google API keys, OpenAI, Slack), PEM private
  keys and bearer tokens, see :func:`find_secret`.

A literal value under a secret-like name counts as a secret unless it is plainly not one:
empty, a boolean, a small number, an absolute file path, or a ``$(VAR)`` reference
(:func:`harmless_literal`).

Example:
    >>> is_secret_name("hf-token"), is_secret_name("MAX_TOKENS"), is_secret_name("PAD_TOKEN")
    (True, False, False)
    >>> redact_text("pull s3://AKIAIOSFODNN7EXAMPLE:wJalr@bucket/x with HF_TOKEN=abc")
    'pull s3://***@bucket/x with HF_TOKEN=***'
"""

from __future__ import annotations

import re
from typing import Any

HIDDEN = "<hidden>"
MASK = "***"

# Words that, last in a name, mean the name holds a credential.
_LAST_WORDS = {
    "TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "PASS", "PWD", "PW", "APIKEY", "CREDENTIAL",
    "CREDENTIALS", "CREDS", "PRIVATEKEY", "AUTHORIZATION", "COOKIE", "SAS", "HMAC",
}  # fmt: skip
# Endings of the name with separators removed (catches HFTOKEN, hf.token, apiKey, SECRET_ACCESS_KEY).
_SUFFIXES = (
    "TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "APIKEY", "ACCESSKEY", "ACCESSKEYID", "SECRETKEY",
    "PRIVATEKEY", "ACCOUNTKEY", "STORAGEKEY", "SIGNINGKEY", "ENCRYPTIONKEY", "MASTERKEY", "HMACKEY", "SSHKEY",
    "CLIENTKEY", "SERVICEKEY", "CREDENTIAL", "CREDENTIALS", "CONNECTIONSTRING", "CONNSTRING", "AUTH", "AUTHKEY",
    "BASICAUTH", "SASTOKEN", "SASURL",
)  # fmt: skip
# Trailing words that qualify a credential without changing what it is (HF_TOKEN_READ, DB_PASSWORD_2).
_QUALIFIERS = {
    "READ", "WRITE", "RO", "RW", "B64", "BASE64", "JSON", "VALUE", "DATA", "RAW", "PLAIN", "PLAINTEXT", "ENCODED",
    "OLD", "NEW", "PRIMARY", "SECONDARY", "PROD", "DEV", "TEST", "STAGING",
}  # fmt: skip
# Trailing words that make the name a reference to a credential, not one (TOKEN_FILE, SECRET_NAME).
_REFERENCES = {
    "FILE", "PATH", "DIR", "DIRECTORY", "NAME", "REF", "KEYREF", "MOUNT", "ENV", "VAR", "LENGTH", "LEN", "TTL",
    "EXPIRY", "EXPIRATION", "EXPIRATIONSECONDS", "TYPE", "URL", "ENDPOINT", "HEADER", "ENABLED", "REQUIRED", "COUNT",
    "LIMIT", "SIZE", "MODE", "KIND",
}  # fmt: skip
# Tokenizer special tokens: configuration, not credentials.
_TOKENIZER = {"PAD", "EOS", "BOS", "UNK", "SEP", "CLS", "MASK", "START", "END", "STOP", "SPECIAL", "EOT", "IMAGE"}
_NOT_SECRET = {"PWD", "OLDPWD", "PASS", "TOKEN_ID"}

# scheme://user:password@ -- the password may hold '/' (S3 secret keys do; people paste them unencoded)
_URI_CREDENTIALS = re.compile(r"(?<![A-Za-z0-9+.-])(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^?#@\s/]*(?::[^?#@\s]*)?@)")
# user:password@host without a scheme (image references, connection strings)
_BARE_CREDENTIALS = re.compile(r"(?<![\w.%+:/-])(?!mailto:)(?P<user>[\w.%+-]+):(?P<password>[^\s/@:]+)@(?=[A-Za-z0-9])")
_TOKEN_FORMATS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("a Hugging Face token", re.compile(r"\bhf_[A-Za-z0-9]{30,}")),
    ("an AWS access key id", re.compile(r"\b(?:AKIA|ASIA|AIDA|AROA)[A-Z0-9]{16}\b")),
    ("a GitHub token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,})")),
    ("a GitLab token", re.compile(r"\bglpat-[A-Za-z0-9_-]{20,}")),
    ("a Google API key", re.compile(r"\bAIza[0-9A-Za-z_-]{35}")),
    ("an OpenAI key", re.compile(r"\bsk-(?:proj-)?[A-Za-z0-9_-]{20,}")),
    ("a Slack token", re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}")),
    ("a private key", re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z ]*PRIVATE KEY-----|\Z)")),
    ("a bearer token", re.compile(r"\b[Bb]earer\s+[A-Za-z0-9._~+/=-]{16,}")),
)
# NAME=value and --flag=value pairs inside free text, where NAME/flag may be secret-like.
_ASSIGNMENT = re.compile(
    r"(?P<key>(?<![A-Za-z0-9_.-])-{0,2}[A-Za-z_][A-Za-z0-9_.-]*)(?P<sep>[\"']?(?:=|:[ \t]*)[\"']?)(?P<value>[^\s'\",;&}]+)"
)
_REFERENCE = re.compile(r"\$\([A-Za-z_][A-Za-z0-9_.-]*\)|\$\{[A-Za-z_][A-Za-z0-9_]*\}|\$[A-Za-z_][A-Za-z0-9_]*")
_HARMLESS = {"", "true", "false", "yes", "no", "on", "off", "none", "null", "0", "1"}
_MAX_SCRUB_DEPTH = 64


def _words(name: str) -> list[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    return [w for w in re.split(r"[^A-Za-z0-9]+", spaced.upper()) if w]


def is_secret_name(name: Any) -> bool:
    """True when a variable, key or flag named ``name`` would hold a credential.

    Separators and case do not matter (``HF_TOKEN``, ``hf-token``, ``HFTOKEN``, ``hf.token``,
    ``--hf-token``); trailing qualifiers are looked through (``HF_TOKEN_READ``, ``DB_PASSWORD_2``);
    references to a credential are not secrets (``TOKEN_FILE``, ``SECRET_NAME``), nor are
    tokenizer settings (``PAD_TOKEN``) or plurals (``MAX_TOKENS``).

    Example:
        >>> [is_secret_name(n) for n in ("HFTOKEN", "hf.token", "AWS_SECRET_ACCESS_KEY", "TOKEN_FILE", "TOKENIZER")]
        [True, True, True, False, False]
    """
    if not isinstance(name, str) or not name:
        return False
    words = _words(name)
    while len(words) > 1 and (words[-1].isdigit() or words[-1] in _QUALIFIERS):
        words.pop()
    if not words or "_".join(words) in _NOT_SECRET:
        return False
    if "".join(words).endswith("SASURL"):
        return True
    if words[-1] in _REFERENCES:
        return False
    if len(words) > 1 and words[-1] == "TOKEN" and words[-2] in _TOKENIZER:
        return False
    if words[-1] in ("PASS", "PW", "PWD", "SAS", "HMAC", "COOKIE") and len(words) == 1:
        return False
    if words[-1] in _LAST_WORDS:
        return True
    joined = "".join(words)
    if any(joined.startswith(t) and joined == t + "TOKEN" for t in _TOKENIZER):
        return False
    return joined.endswith(_SUFFIXES)


def is_reference(value: str) -> bool:
    """True when ``value`` is only a variable reference (``$(HF_TOKEN)``, ``${X}``, ``$X``)."""
    return bool(_REFERENCE.fullmatch(value))


def harmless_literal(value: Any) -> bool:
    """True for a literal that cannot be a credential whatever its name says.

    Example:
        >>> [harmless_literal(v) for v in ("", "true", "8", "/var/run/secrets/token", "$(HF_TOKEN)", "hf_abc")]
        [True, True, True, True, True, False]
    """
    if value is None or isinstance(value, bool):
        return True
    if isinstance(value, int):
        return abs(value) < 10**8
    if not isinstance(value, str):
        return False
    text = value.strip()
    if text.lower() in _HARMLESS or (text.isascii() and text.isdigit() and len(text) <= 8):
        return True
    if is_reference(text):
        return True
    return text.startswith("/") and re.fullmatch(r"/[A-Za-z0-9._/-]*", text) is not None and find_secret(text) is None


def names_itself(key: str, value: str) -> bool:
    """True when ``value`` is ``key``'s own name in another spelling: a mapping of names, not a secret.

    Example:
        >>> names_itself("hf_token", "HF_TOKEN"), names_itself("hf_token", "hf_abc123")
        (True, False)
    """
    return bool(_words(key)) and _words(key) == _words(value)


def find_secret(text: Any) -> str | None:
    """What in ``text`` looks like a credential (e.g. ``"a credential in a URI"``), or ``None``.

    Example:
        >>> find_secret("https://user:pass@example.com/x"), find_secret("https://example.com/x")
        ('a credential in a URI', None)
    """
    if not isinstance(text, str):
        return None
    for match in _URI_CREDENTIALS.finditer(text):
        userinfo = match.group("userinfo")[:-1]
        if ":" in userinfo or len(userinfo) >= 20:  # user:password, or a token as the user
            return "a credential in a URI"
    if _BARE_CREDENTIALS.search(text):
        return "a credential before @host (user:password@)"
    for what, pattern in _TOKEN_FORMATS:
        if pattern.search(text):
            return what
    return None


def redact_uri(uri: str) -> str:
    """``uri`` without its ``user:password@`` part (also in ``user:password@host`` without a scheme).

    Example:
        >>> redact_uri("s3://key:secret@bucket/data"), redact_uri("me:pw@registry.example.com/img")
        ('s3://***@bucket/data', '***@registry.example.com/img')
    """
    masked = _URI_CREDENTIALS.sub(lambda m: m.group("scheme") + MASK + "@", uri)
    return _BARE_CREDENTIALS.sub(MASK + "@", masked)


def redact_text(text: str) -> str:
    """``text`` with credentials masked: URI credentials, token formats, ``SECRET_NAME=value``.

    Example:
        >>> redact_text("--hf-token=hf_abc --lr=0.1")
        '--hf-token=*** --lr=0.1'
    """
    if not isinstance(text, str) or not text:
        return text
    return _mask_assignments(redact_formats(text))


def redact_formats(text: str) -> str:
    """``text`` with URI credentials and known token formats masked (not ``NAME=value``, which prose can resemble).

    Example:
        >>> redact_formats("credentials: name a Secret, not s3://key:secret@bucket or hf_abcdefghijklmnopqrstuvwxyz0123")
        'credentials: name a Secret, not s3://***@bucket or ***'
    """
    out = redact_uri(text)
    for _, pattern in _TOKEN_FORMATS:
        out = pattern.sub(MASK, out)
    return out


def _mask_assignments(text: str) -> str:
    """``text`` with the value of each ``SECRET_NAME=value`` (or ``: value``) masked.

    The value after a harmless name is searched too: in ``note: HF_TOKEN=abc`` the
    assignment is the value of ``note``.
    """
    out, pos = [], 0
    while (match := _ASSIGNMENT.search(text, pos)) is not None:
        key, value = match.group("key").lstrip("-"), match.group("value")
        if is_secret_name(key) and not harmless_literal(value) and not names_itself(key, value):
            out.append(text[pos : match.start("value")] + MASK)
            pos = match.end()
        else:
            out.append(text[pos : match.start("value")])
            pos = match.start("value")
    return "".join(out) + text[pos:]


def _is_env_item(value: dict[Any, Any]) -> bool:
    return isinstance(value.get("name"), str) and "value" in value and set(value) <= {"name", "value", "valueFrom"}


def shorten(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters *after* redacting a little more, so no secret is cut in half."""
    if len(text) <= limit:
        return redact_text(text)
    return redact_text(text[: limit + 512])[: max(limit - 3, 0)] + "..."


def scrub(value: Any, *, limit: int = 2000) -> Any:
    """A copy of ``value`` fit to show: secret-like keys and env items hidden, text redacted.

    At most ``limit`` values are copied (``"..."`` stands for the rest), so a huge or
    self-referencing value costs little.

    Example:
        >>> scrub({"HF_TOKEN": "abc", "env": [{"name": "PASSWORD", "value": "x"}], "uri": "s3://k:s@b/p"})
        {'HF_TOKEN': '<hidden>', 'env': [{'name': 'PASSWORD', 'value': '<hidden>'}], 'uri': 's3://***@b/p'}
    """
    budget = [limit]

    def copy(item: Any, depth: int) -> Any:
        budget[0] -= 1
        if budget[0] < 0 or depth > _MAX_SCRUB_DEPTH:
            return "..."
        if isinstance(item, str):
            return shorten(item, 4096)
        if isinstance(item, dict):
            hide_value = _is_env_item(item) and is_secret_name(item["name"]) and not harmless_literal(item["value"])
            out = {}
            for k, v in item.items():
                secret_key = is_secret_name(k) and not harmless_literal(v) and not isinstance(v, dict)
                out[k] = HIDDEN if secret_key or (hide_value and k == "value") else copy(v, depth + 1)
            return out
        if isinstance(item, (list, tuple)):
            return type(item)(copy(v, depth + 1) for v in item)
        return item

    return copy(value, 0)


def env_item_shape(item: Any) -> Any:
    """What an error may show of a malformed env item: its keys and its name, every value hidden.

    A malformed item says nothing about which of its values is the secret, so none of its
    texts is shown.

    Example:
        >>> env_item_shape({"name": "HF_TOKEN", "value": "hf_x", "extra": 1}), env_item_shape(["HF_TOKEN", "hf_x"])
        ({'name': 'HF_TOKEN', 'value': '<hidden>', 'extra': '<hidden>'}, 'a list of 2 items')
    """
    if isinstance(item, dict):
        return {k: v if k == "name" and isinstance(v, str) else HIDDEN for k, v in item.items()}
    if isinstance(item, (list, tuple)):
        return f"a list of {len(item)} items"
    if item is None or isinstance(item, (bool, int, float)):
        return item  # shown as any number is: hidden under a secret-like name, see shown_value
    return HIDDEN


def _path_names(field: str) -> list[str]:
    return [p for p in re.split(r"[.\[\]'\"]+", field) if p and not p.isdigit()]


# Inputs and manifest keys that hold the *name* of a Secret, never its content.
REFERENCE_FIELDS = frozenset({"dataset_secret", "model_secret", "image_pull_secrets", "secretRef", "secretKeyRef", "secretName"})


def shown_value(field: str, value: Any) -> Any:
    """What an error about ``field`` may show of ``value``: hidden under a secret-like name, else scrubbed.

    Example:
        >>> shown_value("env['HF_TOKEN']", "hf_x"), shown_value("image", "s3://a:b@c")
        ('<hidden>', 's3://***@c')
    """
    names = _path_names(field)
    if any(is_secret_name(n) and n not in REFERENCE_FIELDS for n in names) and not harmless_literal(value):
        return HIDDEN
    return scrub(value)
