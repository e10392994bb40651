"""Session keys and ids: build, parse, and clear errors on malformed input."""

from __future__ import annotations

import pytest

from runtime.memory import (
    SessionId,
    SessionKey,
    SessionKeyError,
    make_session_id,
    make_session_key,
    parse_session_id,
    parse_session_key,
)


def test_build_and_parse_round_trip() -> None:
    key = make_session_key("onebot11", "10001", "group", "123456")
    assert key == "onebot11:10001:group:123456"
    assert parse_session_key(key) == SessionKey("onebot11", "10001", "group", "123456")
    sid = make_session_id(key, 3)
    assert sid == "onebot11:10001:group:123456#3"
    assert parse_session_id(sid) == SessionId(SessionKey("onebot11", "10001", "group", "123456"), 3)
    assert str(parse_session_id(sid)) == sid


def test_private_scene_is_peer_and_scene_may_hold_colons() -> None:
    key = make_session_key("telegram", "777", "private", "chat:-100:5")
    assert parse_session_key(key) == SessionKey("telegram", "777", "private", "chat:-100:5")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("onebot11:10001:group", "expected 'platform:bot_id:scope:scene_id'"),
        ("onebot11:10001:room:1", "scope must be one of private|group|channel, got 'room'"),
        ("onebot11::group:1", "part 'bot_id' must be a non-empty string"),
        ("onebot11:10001:group:", "part 'scene_id' must be a non-empty string"),
        ("onebot11:10001:group:1 2", "may not contain '#', whitespace or control characters"),
        ("onebot11:10001:group:1#2", "may not contain '#'"),
    ],
)
def test_malformed_keys(text: str, fragment: str) -> None:
    with pytest.raises(SessionKeyError) as err:
        parse_session_key(text)
    assert fragment in str(err.value)
    assert repr(text) in str(err.value)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("onebot11:10001:group:1", "expected '{session_key}#{epoch}'"),
        ("onebot11:10001:group:1#0", "epoch '0' is not an int >= 1"),
        ("onebot11:10001:group:1#01", "epoch '01' is not an int >= 1"),
        ("onebot11:10001:group:1#x", "epoch 'x' is not an int >= 1"),
        ("onebot11:10001:lobby:1#2", "scope must be one of"),
    ],
)
def test_malformed_ids(text: str, fragment: str) -> None:
    with pytest.raises(SessionKeyError) as err:
        parse_session_id(text)
    assert fragment in str(err.value)


def test_make_rejects_bad_parts() -> None:
    with pytest.raises(SessionKeyError, match="part 'platform' = 'a:b' may not contain ':'"):
        make_session_key("a:b", "1", "group", "2")
    with pytest.raises(SessionKeyError, match="epoch must be an int >= 1, got 0"):
        make_session_id("a:1:group:2", 0)
    with pytest.raises(SessionKeyError, match="epoch must be an int >= 1, got True"):
        make_session_id("a:1:group:2", True)
