"""Stop strings: cut at the first occurrence, never emit the stop string, hold back only a tail."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from splitserve.router.stops import StopStrings


def _feed_all(stops: list[str], pieces: list[str]) -> tuple[str, str | None]:
    matcher = StopStrings(stops)
    out = "".join(matcher.feed(p) for p in pieces)
    out += matcher.flush()
    return out, matcher.hit


@pytest.mark.parametrize(
    ("stops", "pieces", "want", "hit"),
    [
        (["\n\n"], ["Hello\n", "\nWorld"], "Hello", "\n\n"),
        (["END"], ["abcE", "N", "Dxyz"], "abc", "END"),
        (["xyz", "b"], ["abc xyz"], "a", "b"),
        (["stop"], ["no match here"], "no match here", None),
        ([], ["anything"], "anything", None),
        (["", "zz"], ["a", "z"], "az", None),
    ],
    ids=["across-pieces", "split-three-ways", "earliest-wins", "no-hit", "no-stops", "empty-stop"],
)
def test_examples(stops: list[str], pieces: list[str], want: str, hit: str | None) -> None:
    assert _feed_all(stops, pieces) == (want, hit)


def test_holds_back_only_what_could_start_a_stop_string() -> None:
    matcher = StopStrings(["STOP", "x"])
    assert matcher.feed("hello ST") == "hello "
    assert matcher.feed("ART") == "START"
    assert matcher.flush() == ""


def test_waits_for_a_longer_stop_string_that_starts_earlier() -> None:
    matcher = StopStrings(["a", ".aa"])
    assert matcher.feed(".a") == ""  # "a" matched, but ".aa" may be completing at 0
    assert matcher.hit is None
    assert matcher.feed("a") == ""
    assert matcher.hit == ".aa"


def test_flush_resolves_a_pending_match() -> None:
    matcher = StopStrings(["a", ".aa"])
    assert matcher.feed("x.a") == "x"
    assert matcher.flush() == "."
    assert matcher.hit == "a"


def test_after_a_hit_everything_is_dropped() -> None:
    matcher = StopStrings(["."])
    assert matcher.feed("one. two") == "one"
    assert matcher.feed("three") == ""


_alphabet = st.sampled_from("ab\n.")


@given(
    text=st.text(_alphabet, max_size=40),
    stops=st.lists(st.text(_alphabet, min_size=1, max_size=4), max_size=3),
    cuts=st.lists(st.integers(0, 40), max_size=10),
)
def test_output_is_text_cut_at_first_stop(text: str, stops: list[str], cuts: list[int]) -> None:
    bounds = [0, *sorted({c for c in cuts if c <= len(text)}), len(text)]
    pieces = [text[a:b] for a, b in itertools.pairwise(bounds)]
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    want = text[: min(found)] if found else text
    out, hit = _feed_all(stops, pieces)
    assert out == want
    assert (hit is not None) == bool(found)


def _guarded_want(text: str, stops: list[str], guard: int) -> tuple[str, bool]:
    """vLLM's reading: a match counts only if it ends after the first `guard` characters."""
    found = [i for i in (text.find(s, max(0, guard - len(s) + 1)) for s in stops) if i >= 0]
    return (text[: min(found)], True) if found else (text, False)


def test_a_stop_string_inside_the_guarded_text_is_kept() -> None:
    matcher = StopStrings([" co"])
    assert matcher.feed(" co", guarded=3) == " co"
    assert matcher.feed("nsidered co") == "nsidered"
    assert matcher.hit == " co"


def test_a_match_that_starts_in_the_guarded_text_cuts_where_it_starts() -> None:
    matcher = StopStrings(["abc"])
    assert matcher.feed("xab", guarded=3) == "x"  # "ab" may still become "abc"
    assert matcher.feed("c tail") == ""
    assert matcher.hit == "abc"


@given(
    text=st.text(_alphabet, max_size=40),
    stops=st.lists(st.text(_alphabet, min_size=1, max_size=4), max_size=3),
    cuts=st.lists(st.integers(0, 40), max_size=10),
    guard=st.integers(0, 40),
)
def test_guarded_text_cannot_end_a_match(
    text: str, stops: list[str], cuts: list[int], guard: int
) -> None:
    guard = min(guard, len(text))
    bounds = [0, *sorted({c for c in cuts if c <= len(text)}), len(text)]
    matcher = StopStrings(stops)
    out = ""
    for a, b in itertools.pairwise(bounds):
        out += matcher.feed(text[a:b], guarded=max(0, min(b, guard) - a))
    out += matcher.flush()
    want, hit = _guarded_want(text, stops, guard)
    assert out == want
    assert (matcher.hit is not None) == hit
