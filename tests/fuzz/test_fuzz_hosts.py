"""Fuzz what browsers name and send: Host headers (agent.app.hosts) and login redirect targets (the UI's
``next``): no input raises, a refused name stays refused, and no kept target leads a browser off the agent."""

from __future__ import annotations

import ipaddress
import re

from hypothesis import given
from hypothesis import strategies as st

from agent.app.hosts import HostPolicy, split_host
from agent.app.ui.pages import _local_path
from agent.config import ServerConfig
from tests.fuzz import budget

POLICY = HostPolicy.from_config(ServerConfig(listen="127.0.0.1:9400", allowed_hosts=["agent.internal"]))
# Characters browsers treat specially in a URL, mixed into arbitrary text.
_TRICKY = st.sampled_from(["/", "\\", "\t", "\n", "\r", " ", "\x00", "\x1f", "%", "2F", "5C", "09", ":", "@", "?",
                           "#", ".", "evil.example", "http", "\u3000", "\u2028", "\uff0f", "[", "]", "localhost"])
_TEXT = st.lists(st.one_of(_TRICKY, st.text(max_size=4)), max_size=12).map("".join)


def _browser_leaves(location: str) -> bool:
    """Whether a browser resolving ``location`` against the agent's URL lands on another host (WHATWG:
    C0 controls and spaces stripped at the ends, tab and newlines dropped, ``\\`` read as ``/``)."""
    text = location.strip("".join(map(chr, range(0x21)))).replace("\t", "").replace("\n", "").replace("\r", "")
    text = text.replace("\\", "/")
    return bool(re.match(r"[A-Za-z][A-Za-z0-9+.-]*:", text)) or text.startswith("//")


@budget(100)
@given(_TEXT)
def test_login_targets_never_leave_the_agent(text: str) -> None:
    """Any next= is kept as written or replaced by /alerts, and what is kept stays on the agent's host."""
    kept = _local_path(text)
    assert kept in (text, "/alerts")
    assert kept.startswith("/") and not _browser_leaves(kept)


@budget(100)
@given(_TEXT)
def test_host_headers_never_raise_and_unknown_names_are_refused(text: str) -> None:
    """Any Host header parses or is refused without an exception; a name other than the allowed ones,
    with any port, is refused."""
    parsed = split_host(text)
    allowed = POLICY.allows(text)
    if parsed is None:
        assert not allowed
        return
    host = parsed[0]
    try:
        ipaddress.ip_address(host)
        known = True
    except ValueError:
        known = host in ("localhost", "agent.internal")
    if not known:
        assert not allowed, text
