"""JSON for the `mesh` fast path through the interpreter's C accelerator (`_json`) alone.

`import json` loads `re` (and with it enum, functools, the regex compiler) and compiles six patterns: ~5 ms of
CPU, a quarter of what a `mesh submit` costs on top of the interpreter's start. The C scanner and encoder under
`json` need none of it. They are CPython's private interface, called here with the arguments json.scanner and
json.encoder pass them; where they are missing or refuse those, `dumps` and `loads` are json's own. Same output as
`json.dumps(obj, separators=..., default=...)` (ensure_ascii, NaN allowed) and `json.loads`; a malformed document
raises ValueError (json.JSONDecodeError, imported only then).
"""

from __future__ import annotations

_CONSTANTS = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}
_WHITESPACE = " \t\n\r"


def _raise(obj: object) -> object:
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


class _Context:  # what the C scanner reads from a json.JSONDecoder
    strict = True
    object_hook = object_pairs_hook = None
    parse_float, parse_int = float, int
    parse_constant = _CONSTANTS.__getitem__


try:
    from _json import encode_basestring_ascii as _quote
    from _json import make_encoder as _make_encoder
    from _json import make_scanner as _make_scanner

    _scan = _make_scanner(_Context())
    _make_encoder(None, _raise, _quote, None, ":", ",", False, False, True)  # takes these arguments here
except (ImportError, TypeError, AttributeError):  # another interpreter: json's own
    _scan = None


def dumps(obj: object, separators: tuple[str, str] = (", ", ": "), default=None) -> str:
    """`json.dumps(obj, separators=separators, default=default)`."""
    if _scan is None:
        import json

        return json.dumps(obj, separators=separators, default=default)
    item, key = separators
    encode = _make_encoder({}, default or _raise, _quote, None, key, item, False, False, True)
    return "".join(encode(obj, 0))


def loads(data: str | bytes) -> object:
    """`json.loads(data)` (bytes as UTF-8)."""
    if _scan is None:
        import json

        return json.loads(data)
    text = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
    start = len(text) - len(text.lstrip(_WHITESPACE))
    try:
        obj, end = _scan(text, start)
    except StopIteration as exc:
        _malformed("Expecting value", text, exc.value)
    rest = text[end:].lstrip(_WHITESPACE)
    if rest:
        _malformed("Extra data", text, len(text) - len(rest))
    return obj


def _malformed(message: str, text: str, pos: int):
    from json import JSONDecodeError

    raise JSONDecodeError(message, text, pos) from None
