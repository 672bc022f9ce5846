"""How an id appears in a JSON answer: one rule for users and items on every route.

An id is one id whatever its spelling: the integer 405 and the text "405" hash to one key
(``sketches.hashing``). A query string carries every id as text and a stream may carry numbers,
so answers would give one user as "405" and one item as 405. Here a canonical decimal integer
(no sign but a leading minus, no leading zeros, no spaces) is a JSON number, and any other id is
a string. Integers beyond 2^53 stay strings: a JavaScript client would round them.
"""

from __future__ import annotations

EXACT_IN_JSON = 2 ** 53   # the largest magnitude every JSON reader (JavaScript's doubles) keeps exact


def json_id(value: object) -> int | str:
    """The id as an answer carries it.

    >>> json_id("405"), json_id(405), json_id("0405"), json_id("abc"), json_id("-3")
    (405, 405, '0405', 'abc', -3)
    >>> json_id(2 ** 60)
    '1152921504606846976'
    """
    if isinstance(value, bool):   # not an id form (True would be 1)
        return str(value)
    if isinstance(value, int):
        return value if -EXACT_IN_JSON < value < EXACT_IN_JSON else str(value)
    text = str(value)
    digits = text[1:] if text.startswith("-") else text
    if digits.isascii() and digits.isdigit() and (digits == "0" or not digits.startswith("0")) \
            and len(digits) <= 16 and not text == "-0":
        number = int(text)
        if -EXACT_IN_JSON < number < EXACT_IN_JSON:
            return number
    return text
