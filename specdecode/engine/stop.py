"""Stop strings: a request's output text streamed through them, cut exactly where plain decoding
would cut it however many tokens a step adds."""
from __future__ import annotations


def _failure(s: str) -> list[int]:
    """Knuth-Morris-Pratt failure table: f[i] = length of the longest proper prefix of s[:i + 1]
    that is also its suffix."""
    f, k = [0] * len(s), 0
    for i in range(1, len(s)):
        while k and s[i] != s[k]:
            k = f[k - 1]
        if s[i] == s[k]:
            k += 1
        f[i] = k
    return f


class StopChecker:
    """Streams a request's output text through its stop strings, one piece at a time.

    When several stop strings occur, the one whose match *ends* first wins (ties: the one starting
    first). That is what checking after every single character gives, so the result does not depend
    on how text arrives in pieces: speculative decoding adds several tokens at once and must still
    cut exactly where plain decoding would. Each stop string has a Knuth-Morris-Pratt matcher whose
    state is the longest suffix of the text so far that is a prefix of it, so every character is
    looked at once (amortised), however long the output grows. That suffix is held back from
    streaming while no stop string has completed: it may still become one."""

    def __init__(self, stop: tuple[str, ...]):
        self.stop = tuple(s for s in stop if s)
        self._fail = [_failure(s) for s in self.stop]
        self._state = [0] * len(self.stop)
        self._first = frozenset(s[0] for s in self.stop)
        self.held = ""  # text not released yet: the start of a possible stop string
        self.matched: str | None = None  # the stop string that ended the text

    def feed(self, text: str) -> str:
        """Appends ``text`` to the stream and returns what can be released now. Once a stop string
        has completed (``matched``), the release ends just before it and later text is ignored."""
        if self.matched is not None:
            return ""
        if not self.stop:
            return text
        stream, base = self.held + text, len(self.held)
        state, stops, fail = self._state, self.stop, self._fail
        for i, c in enumerate(text):
            if c not in self._first and not any(state):
                continue  # the common case: nothing started and c starts no stop string
            best = -1
            for j, s in enumerate(stops):
                k = state[j]
                while k and s[k] != c:
                    k = fail[j][k - 1]
                k += s[k] == c
                state[j] = k
                if k == len(s) and (best < 0 or len(s) > len(stops[best])):
                    best = j
            if best >= 0:
                self.matched, self.held = stops[best], ""
                return stream[:base + i + 1 - len(stops[best])]
        cut = len(stream) - max(state)
        self.held = stream[cut:]
        return stream[:cut]

    def flush(self) -> str:
        """The text ended without a stop string: releases what was held back."""
        out, self.held = self.held, ""
        return out
