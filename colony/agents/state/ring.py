"""ContextRing: an agent's gathered context, bounded, and persisted by appends only.

Event handlers add context entries all through an agent's life. Kept as a plain list and stored
as one blackboard value, the context grew without limit and was rewritten whole at every step.
The ring keeps the newest `cap` entries and numbers every entry ever added (its position), so a
reader that remembers a position (`ring[seen:]`, `len(ring)`) still gets exactly what is new even
after old entries were dropped. `pending()` is what has not been stored yet: `Agent.persist` pushes
only that to a capped Redis list (`Transaction.ring_push`), never the whole context.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any, overload

from colony.errors import InvalidArgument


class ContextRing:
    """The newest `cap` context entries; `len()` is the position after the last entry ever added."""

    def __init__(self, cap: int, items: Iterable[dict[str, Any]] = (), *, total: int | None = None) -> None:
        if cap < 1:
            raise InvalidArgument(f"a context ring holds at least one entry; cap={cap}: pass cap >= 1")
        self.cap = cap
        self._items: deque[dict[str, Any]] = deque(items, maxlen=cap)
        # positions: entry i of the ring is at position first + i
        self._total = len(self._items) if total is None else max(int(total), len(self._items))
        self._persisted = self._total  # what the blackboard already holds

    @classmethod
    def restored(cls, cap: int, stored: dict[str, Any], items: list[dict[str, Any]] | None) -> ContextRing:
        """The ring from the `agent:context` entry and the stored ring's items. An entry written
        before the context became a ring holds the whole list: it goes to the ring at the next persist."""
        if items is None:
            ring = cls(cap, stored.get("context") or [])
            ring._persisted = 0
            return ring
        return cls(cap, items, total=stored.get("context_total"))

    @property
    def first(self) -> int:
        """Position of the oldest entry still held."""
        return self._total - len(self._items)

    def append(self, item: dict[str, Any]) -> None:
        self._items.append(item)
        self._total += 1

    def extend(self, items: Iterable[dict[str, Any]]) -> None:
        for item in items:
            self.append(item)

    def pending(self) -> list[dict[str, Any]]:
        """Entries added since the last `mark_persisted()` that are still held (the newest, at most cap)."""
        new = self._total - self._persisted
        return list(self._items)[-new:] if new > 0 else []

    def mark_persisted(self, position: int | None = None) -> None:
        """The blackboard holds every entry before `position` (default: all of them). Persisting
        passes the position it read with `pending()`, so entries appended while the write was in
        flight stay pending."""
        upto = self._total if position is None else min(int(position), self._total)
        self._persisted = max(self._persisted, upto)

    def __len__(self) -> int:
        return self._total

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(list(self._items))

    def __bool__(self) -> bool:
        return bool(self._items)

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, index: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        """By position: `ring[p]` is the entry at position p (IndexError once dropped), `ring[p:]`
        the entries held from position p on (a slice step is not supported)."""
        if isinstance(index, slice):
            if index.step not in (None, 1):
                raise InvalidArgument(
                    f"ContextRing slices take no step (got step {index.step}): use ring[a:b]"
                )
            start = 0 if index.start is None else index.start
            stop = self._total if index.stop is None else index.stop
            start, stop = (p + self._total if p < 0 else p for p in (start, stop))
            lo, hi = max(start, self.first) - self.first, max(0, min(stop, self._total) - self.first)
            return list(self._items)[lo:hi] if lo < hi else []
        position = index + self._total if index < 0 else index
        if not self.first <= position < self._total:
            raise IndexError(f"context position {index} is not held (held: {self.first}..{self._total - 1})")
        return self._items[position - self.first]

    def __repr__(self) -> str:
        return f"ContextRing(cap={self.cap}, held={len(self._items)}, total={self._total})"
