"""Words for numbers in what users read: `plural` ("1 slot", "2 slots") and
`span` ("ranks 0-1"). Pure standard library, so every layer may use it.

Example:
    >>> plural(1, "slot"), plural(3, "process", "processes")
    ('1 slot', '3 processes')
"""

from __future__ import annotations

__all__ = ["plural", "span"]


def plural(count: int, noun: str, plural_form: str | None = None) -> str:
    """`count` and `noun`, in the plural unless `count` is 1.

    Example:
        >>> plural(1, "node"), plural(0, "restart"), plural(2, "GPU")
        ('1 node', '0 restarts', '2 GPUs')
    """
    return f"{count} {noun if count == 1 else plural_form or noun + 's'}"


def span(noun: str, count: int) -> str:
    """The members 0..count-1 of something numbered from 0: "rank 0 only", "ranks 0-1".

    Example:
        >>> span("rank", 1), span("rank", 2), span("node", 8)
        ('rank 0 only', 'ranks 0-1', 'nodes 0-7')
    """
    if count <= 1:
        return f"{noun} 0 only"
    return f"{noun}s 0-{count - 1}"
