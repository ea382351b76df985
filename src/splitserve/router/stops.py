"""Router-side stop strings.

Workers stop on token ids; a stop *string* can span tokens, so the router matches it on text.
The matcher emits text as soon as it cannot be part of a match, holds back a tail that might
still start one, and ends the stream at the earliest occurrence of any stop string (never
emitting the stop string itself). A complete match is not acted on while a longer stop string
that starts earlier could still complete, so the cut is the same however the text is split.
Invariant: the concatenation of everything emitted, `flush()` included, equals the full text
cut at the first occurrence of any stop string; `hit` is set exactly when there is one.

Text fed as *guarded* (`feed(text, guarded=n)`: the output of a request's first `min_tokens`
tokens) cannot end a match, as in vLLM, which checks stop strings only once a request has more
than `min_tokens` output tokens and then only for matches that end in the new text: a stop
string wholly inside the guarded text is kept as text; one that starts there and ends after it
cuts the stream where it starts.
"""

from __future__ import annotations

from collections.abc import Iterable


class StopStrings:
    """Cuts a text stream at the first stop string."""

    def __init__(self, stops: Iterable[str], *, include: bool = False) -> None:
        """`include`: the text ends with the stop string that matched (vLLM's
        `include_stop_str_in_output`); else just before it."""
        self.stops: tuple[str, ...] = tuple(dict.fromkeys(s for s in stops if s))
        self._include = include
        self._longest = max((len(s) for s in self.stops), default=0)
        self._buf = ""
        self._guard = 0
        """Within `_buf`: a match must end after this many characters (guarded text)."""
        self.hit: str | None = None
        """The stop string that ended the stream, once one has."""

    def _first_match(self, buf: str) -> tuple[int, str] | None:
        first: tuple[int, str] | None = None
        guard = self._guard
        for stop in self.stops:
            i = buf.find(stop, max(0, guard - len(stop) + 1)) if guard else buf.find(stop)
            if i >= 0 and (first is None or i < first[0]):
                first = (i, stop)
        return first

    def _first_partial(self, buf: str) -> int:
        """Where the earliest tail of `buf` that could still grow into a stop string starts."""
        for j in range(max(0, len(buf) - self._longest + 1), len(buf)):
            tail = buf[j:]
            if any(len(s) > len(tail) and s.startswith(tail) for s in self.stops):
                return j
        return len(buf)

    def feed(self, text: str, guarded: int = 0) -> str:
        """Add text; return what is safe to emit. After a hit, everything is dropped.

        `guarded`: how many of `text`'s first characters cannot end a match (see the module)."""
        if self.hit is not None:
            return ""
        buf = self._buf + text
        if guarded:
            self._guard = len(self._buf) + guarded
        match = self._first_match(buf)
        partial = self._first_partial(buf)
        if match is not None and match[0] <= partial:
            return self._cut(buf, match)
        safe = partial if match is None else min(partial, match[0])
        self._buf = buf[safe:]
        self._guard = max(0, self._guard - safe)
        return buf[:safe]

    def flush(self) -> str:
        """At the end of the stream: the held-back text, cut at a stop string if one matched."""
        if self.hit is not None:
            return ""
        buf, self._buf = self._buf, ""
        match = self._first_match(buf)
        return buf if match is None else self._cut(buf, match)

    def _cut(self, buf: str, match: tuple[int, str]) -> str:
        self._buf = ""
        self.hit = match[1]
        return buf[: match[0] + (len(match[1]) if self._include else 0)]
