"""Property-based damage to JSON inputs, shared by the mutation tests: draw a place in a value, put junk of another
type there (or delete it), and require the clean result or one line (a MegaevalError)."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from megaeval import MegaevalError

DELETE = object()
JUNK = st.sampled_from([DELETE, None, True, False, -1, 0, 7, 2**40, 1.5, "", "x", "0", [], [1], {}, {"a": 1}])
EXAMPLES = settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


def places(value: Any, at: tuple = ()) -> list[tuple]:
    """Every key path into a JSON value (dict keys and list indices), the root excluded."""
    found = []
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in items:
        found.append((*at, key))
        found += places(child, (*at, key))
    return found


def damaged(value: Any, place: tuple, junk: Any) -> Any:
    """A copy of `value` with the item at `place` replaced by `junk` (or deleted)."""
    value = copy.deepcopy(value)
    parent = value
    for key in place[:-1]:
        parent = parent[key]
    if junk is DELETE:
        del parent[place[-1]]
    else:
        parent[place[-1]] = junk
    return value


def draw_damage(data: st.DataObject, value: Any) -> Any:
    """`value` damaged at one drawn place: a key deleted, or a value replaced by one of another JSON type. List
    items are replaced, never deleted, and strings are never replaced by strings (nor numbers by numbers): a row
    fewer, or another question, is other data, not damaged data."""
    place = data.draw(st.sampled_from(places(value)), label="place")
    old = damaged_at(value, place)
    kinds = (bool, int, float, str, list, dict, type(None))
    same = lambda a, b: next(k for k in kinds if isinstance(a, k)) == next(k for k in kinds if isinstance(b, k))  # noqa: E731
    junk = data.draw(JUNK.filter(lambda j: j is DELETE or not same(j, old)), label="junk")
    return damaged(value, place, None if junk is DELETE and isinstance(place[-1], int) else junk)


def damaged_at(value: Any, place: tuple) -> Any:
    for key in place:
        value = value[key]
    return value


def outcome(run) -> tuple[str, Any]:
    """("ok", numbers) or ("error", message); a message must be one line, any other exception fails the test."""
    try:
        return "ok", run()
    except MegaevalError as e:
        message = str(e)
        assert message and "\n" not in message.strip(), message
        return "error", message


def check(run, expected: Any) -> None:
    kind, got = outcome(run)
    if kind == "ok":
        assert got == expected, "the damaged input was accepted and changed the numbers"
