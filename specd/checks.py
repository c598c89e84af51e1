"""Reading a plugin's constructor options: each function takes one option's value as it
came (Python values from ``Engine(drafter_options=...)``, JSON-parsed text from
``--drafter-option KEY=VALUE``, which leaves text that is not JSON as a string), and returns
it as the type the plugin uses or raises :class:`~specd.errors.BadInputError` naming the
plugin, the option, the value and what it takes::

    eagle option window=0: expected an integer from 1 to 65,536

A value is never clamped or rounded into range in silence: ``topk=0`` or ``width=2.5`` is a
mistake the user should hear of, not a tree of another shape. Upper bounds keep every
option within what the process can hold: an option that sizes a table, a tree or a pass is
bounded before anything is allocated for it.
"""

from __future__ import annotations

import math
import re
from typing import Any

from .errors import BadInputError

#: Text ``integer`` reads: an optional sign and up to 19 decimal digits.
_DECIMAL = re.compile(r"[+-]?[0-9]{1,19}")
#: What ``flag`` reads as true and as false, besides booleans.
_TRUE = frozenset({"true", "on", "yes", "1"})
_FALSE = frozenset({"false", "off", "no", "0"})


def _bad(owner: str, name: str, value: Any, expected: str) -> BadInputError:
    return BadInputError(f"{owner} option {name}={value!r}: expected {expected}")


def _range(lo: float | None, hi: float | None, what: str) -> str:
    if lo is not None and hi is not None:
        return f"{what} from {lo:,} to {hi:,}"
    if lo is not None:
        return f"{what} >= {lo:,}"
    if hi is not None:
        return f"{what} <= {hi:,}"
    return what


def integer(owner: str, name: str, value: Any, *, lo: int | None = 1, hi: int | None = None) -> int:
    """``value`` as an int in ``[lo, hi]`` (either bound None: open). Takes ints, floats
    with no fraction (``4.0``) and decimal text (``"4"``); not booleans.

    :param owner: the plugin's name, as the message starts (``eagle``, ``hybrid``).
    :param name: the option's name as the user gave it (``window``, ``eagle.window``).
    """
    expected = _range(lo, hi, "an integer")
    if isinstance(value, bool):
        raise _bad(owner, name, value, expected)
    if isinstance(value, float):
        if not value.is_integer():
            raise _bad(owner, name, value, expected)
        n = int(value)
    elif isinstance(value, int):
        n = value
    elif isinstance(value, str) and _DECIMAL.fullmatch(value.strip()):
        n = int(value)
    else:
        raise _bad(owner, name, value, expected)
    if (lo is not None and n < lo) or (hi is not None and n > hi):
        raise _bad(owner, name, value, expected)
    return n


def optional_integer(
    owner: str, name: str, value: Any, *, lo: int | None = 1, hi: int | None = None
) -> int | None:
    """Like :func:`integer`, with None (JSON ``null``) for "not given"."""
    return None if value is None else integer(owner, name, value, lo=lo, hi=hi)


def number(
    owner: str,
    name: str,
    value: Any,
    *,
    lo: float | None = None,
    hi: float | None = None,
    above: bool = False,
) -> float:
    """``value`` as a finite float in ``[lo, hi]`` (``above``: greater than ``lo``, not equal).
    Takes ints, floats and decimal text; not booleans, NaN or infinities."""
    if lo is not None and hi is not None:
        expected = f"a number in {'(' if above else '['}{lo:g}, {hi:g}]"
    elif lo is not None:
        expected = f"a number {'>' if above else '>='} {lo:g}"
    else:
        expected = _range(lo, hi, "a number")
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise _bad(owner, name, value, expected)
    try:
        x = float(value)
    except (ValueError, OverflowError):
        raise _bad(owner, name, value, expected) from None
    if not math.isfinite(x):
        raise _bad(owner, name, value, expected)
    if lo is not None and (x < lo or (above and x == lo)):
        raise _bad(owner, name, value, expected)
    if hi is not None and x > hi:
        raise _bad(owner, name, value, expected)
    return x


def flag(owner: str, name: str, value: Any) -> bool:
    """``value`` as a bool: booleans, 0 and 1, and the words true/false, on/off, yes/no (any
    case). Any other text is refused, so that ``use_corpus=off`` is never read as true."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
    raise _bad(owner, name, value, "true or false")
