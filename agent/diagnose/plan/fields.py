"""Numbers out of a ``config.json``, read strictly: a shape field is a positive integer or it is an error.

A Hugging Face config is user input. Python's ``json`` hands back whatever the file holds:
``-3``, ``"32"``, ``NaN``, ``1e999`` (infinity), ``true`` (which *is* an ``int`` in Python)
or a list where a layer count belongs. Skipping such a value silently would plan a different
model than the file describes (a negative ``head_dim`` falling back to hidden / heads), and
passing it on ends in a traceback deep in the arithmetic. So a field that is present must be
usable, and the error names it the way a user finds it in the file
(``text_config.num_hidden_layers: must be a positive integer, got -3``).

``null`` means "not set" (Hugging Face writes ``"sliding_window": null``), and so does ``0``
for optional fields (``"q_lora_rank": 0``, ``"n_shared_experts": 0`` in published configs).
An integral float (``4096.0``) is read as the integer it is. Values are capped: the layer
loops of :mod:`agent.diagnose.plan.shapes` run once per layer, and no published model comes
within orders of magnitude of the caps.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from agent.errors import DiagnosisError

__all__ = ["MAX_LAYERS", "MAX_VALUE", "opt_int", "positive_int"]

#: Any size or count: 2**40 (a trillion) is past every vocabulary, width, length and expert count.
MAX_VALUE = 1 << 40
#: Layer counts: the planner walks the layers one by one; published models have at most a few hundred.
MAX_LAYERS = 100_000


def positive_int(value: Any, path: str, *, maximum: int = MAX_VALUE) -> int:
    """``value`` as a positive integer ≤ ``maximum``; :class:`DiagnosisError` naming ``path`` otherwise."""
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
        number = int(value)
    if number is None or number < 1:
        raise DiagnosisError(f"{path}: must be a positive integer, got {_show(value)}")
    if number > maximum:
        raise DiagnosisError(f"{path}: must be at most {maximum:,}, got {_show(value)}")
    return number


def opt_int(data: Mapping[str, Any], keys: tuple[str, ...], *, prefix: str = "",
            maximum: int = MAX_VALUE) -> int | None:
    """The first of ``keys`` that ``data`` sets (not ``null``, not ``0``), as a positive integer;
    ``None`` when none is set; :class:`DiagnosisError` naming ``prefix + key`` when one is set to
    something else (negative, a string, a boolean, NaN, infinite, fractional, too large)."""
    for key in keys:
        value = data.get(key)
        if value is None or (type(value) in (int, float) and value == 0):
            continue
        return positive_int(value, prefix + key, maximum=maximum)
    return None


def _show(value: Any) -> str:
    """The offending value as the user wrote it, shortened (a config may hold a huge string or list)."""
    text = repr(value) if not isinstance(value, bool) else str(value).lower()
    if isinstance(value, float):
        text = "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity") if math.isinf(value) else text
    return text if len(text) <= 60 else text[:57] + "..."
