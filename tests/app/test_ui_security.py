"""Tests for agent.app.ui.security and .present without a server: sessions, CSRF tokens, links, ages, packaging."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

import pytest

from agent.app.ui.present import age, alert_rows, format_value, safe_url, silence_link
from agent.app.ui.security import Sessions, same_origin
from tests.conftest import REPO


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_sessions_expire_are_capped_and_end_on_logout() -> None:
    """A login lasts its TTL; past the cap the oldest session ends first; logout ends one at once."""
    clock = _Clock()
    s = Sessions("tok", clock=clock, max_sessions=2, ttl_s=60)
    a = s.login()
    clock.t += 30
    b = s.login()
    assert s.logged_in(a) and s.logged_in(b) and not s.logged_in("guess") and not s.logged_in(None)
    clock.t += 10
    c = s.login()  # the cap: a (the oldest) ends
    assert not s.logged_in(a) and s.logged_in(b) and s.logged_in(c)
    clock.t += 51  # b's 60 s are over (at 1090), c's are not (1100)
    assert not s.logged_in(b) and s.logged_in(c)
    s.logout(c)
    assert not s.logged_in(c)
    assert len({a, b, c}) == 3


def test_tokens_csrf_and_no_auth() -> None:
    """The token compares exactly; a CSRF token is bound to one session id and one process; without a
    token every browser counts as logged in and reads are never protected."""
    s = Sessions("tok", protect_reads=True)
    assert s.token_ok("tok") and s.token_ok(" tok\n") and not s.token_ok("tok2") and not s.token_ok("")
    sid = s.new_id()
    assert s.csrf_ok(sid, s.csrf_for(sid))
    assert not s.csrf_ok(s.new_id(), s.csrf_for(sid)) and not s.csrf_ok(sid, "") and not s.csrf_ok(None, "x")
    assert not Sessions("tok").csrf_ok(sid, s.csrf_for(sid))  # another process (a restart): another secret
    open_ = Sessions(None, protect_reads=True)
    assert open_.logged_in(None) and not open_.login_required and not open_.protect_reads
    assert not open_.token_ok("anything")


@pytest.mark.parametrize(("url", "safe"), [
    ("https://example.org/runbooks/X.md", True), ("http://wiki/x", True), ("/runbooks/X.md", True),
    ("javascript:alert(1)", False), (" JavaScript:alert(1)", False), ("data:text/html,<b>", False),
    ("//evil.example/x", False), ("vbscript:x", False), ("https:///nohost", False), ("", False), (None, False),
    ("runbooks/X.md", False),
])
def test_only_http_links_and_local_paths_become_links(url: str | None, safe: bool) -> None:
    """Runbook annotations become an href only when http(s) with a host, or a path on the agent."""
    assert (safe_url(url) is not None) is safe


def test_ages_values_and_silence_links() -> None:
    """Ages read in two units; Go's float text reads as a number; a Silence link pre-fills the labels."""
    assert [age(0, t) for t in (0, 59, 61, 3600, 90061)] == ["0s", "59s", "1m 1s", "1h 0m", "1d 1h"]
    assert age(None, 5) == "never"
    assert [format_value(v) for v in ("2e+01", "9.73e-01", "1.5e+09", "NaN", "x")] == ["20", "0.973", "1.5e+09",
                                                                                         "nan", "x"]
    link = silence_link({"alertname": "A", "instance": 'h"1', "pod": "p"})
    assert link == "/silences?matcher=alertname%3D%22A%22&matcher=instance%3D%22h%5C%221%22#new-silence"


def test_alert_rows_mark_alerts_muted_by_active_silences_only() -> None:
    """An alert is silenced by an active silence whose matchers all match; pending or expired ones do not."""
    alerts = [{"labels": {"alertname": "A", "job": "x"}, "annotations": {}, "state": "pending",
               "activeAt": "2026-01-01T00:00:00Z", "value": "1e+00"},
              {"labels": {"alertname": "B", "job": "x"}, "annotations": {}, "state": "firing",
               "activeAt": "2026-01-01T00:00:00Z", "value": "1e+00"}]

    def silence(sid: str, state: str, name: str, value: str, regex: bool = False) -> dict[str, object]:
        return {"id": sid, "status": {"state": state},
                "matchers": [{"name": name, "value": value, "isRegex": regex, "isEqual": True}]}

    silences = [silence("s1", "active", "alertname", "B"), silence("s2", "expired", "alertname", "A"),
                silence("s3", "pending", "job", "x"), silence("s4", "active", "job", "x|y", regex=True)]
    rows = alert_rows(alerts, silences, now=1767225600.0 + 90)
    assert [(r.name, r.state, r.silenced_by, r.since) for r in rows] == [
        ("B", "firing", ["s1", "s4"], "1m 30s"), ("A", "pending", ["s4"], "1m 30s")]


def test_templates_and_static_files_ship_as_package_data() -> None:
    """Every file under agent/app/ui/templates and static matches pyproject's package-data globs."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    globs = config["tool"]["setuptools"]["package-data"]["agent.app.ui"]
    ui = REPO / "agent" / "app" / "ui"
    files = [p.relative_to(ui).as_posix() for d in ("templates", "static") for p in Path(ui, d).iterdir()]
    assert files and all(any(fnmatch.fnmatch(f, g) for g in globs) for f in files), (files, globs)
    assert "jinja2" in " ".join(config["project"]["dependencies"])


def _palettes() -> list[dict[str, str]]:
    css = (REPO / "agent" / "app" / "ui" / "static" / "ui.css").read_text()
    light = css.split("@media (prefers-color-scheme: dark)")[0]
    dark = css.split("@media (prefers-color-scheme: dark)")[1].split("}\n}")[0]
    return [dict(re.findall(r"--([a-z-]+):\s*(#[0-9a-fA-F]{6})", block)) for block in (light, dark)]


def _contrast(a: str, b: str) -> float:
    def luminance(hex_colour: str) -> float:
        channels = [int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
        lin = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]

    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


# (text, background) pairs the stylesheet puts together: body text, muted text, links, badges, buttons
# (background colour on the link colour) and the current page in the navigation (inverted).
PAIRS = [("fg", "bg"), ("fg", "panel"), ("muted", "bg"), ("muted", "panel"), ("link", "bg"), ("link", "panel"),
         ("firing-fg", "firing-bg"), ("pending-fg", "pending-bg"), ("ok-fg", "ok-bg"), ("info-fg", "info-bg"),
         ("silenced-fg", "silenced-bg"), ("bg", "link"), ("bg", "fg"), ("firing-fg", "bg")]


def test_colours_meet_wcag_aa_contrast_in_light_and_dark() -> None:
    """Every text/background pair the stylesheet uses has at least 4.5:1 contrast (WCAG AA), both schemes."""
    assert round(_contrast("#000000", "#ffffff"), 1) == 21.0 and round(_contrast("#777777", "#ffffff"), 2) == 4.48
    low = []
    for scheme, palette in zip(("light", "dark"), _palettes(), strict=True):
        assert len(palette) >= 15, (scheme, palette)
        for text, background in PAIRS:
            ratio = _contrast(palette[text], palette[background])
            if ratio < 4.5:
                low.append(f"{scheme}: {text} on {background} is {ratio:.2f}:1")
    assert low == []


@pytest.mark.parametrize(("headers", "same"), [
    ({}, True),  # not a cross-site browser request (curl); the CSRF token still decides
    ({"Origin": "http://agent.example:9400"}, True),
    ({"Origin": "https://agent.example:9400"}, True),  # a proxy terminating TLS in front of the agent
    ({"Referer": "http://agent.example:9400/silences"}, True),
    ({"Origin": "http://agent.example:9400", "Sec-Fetch-Site": "same-origin"}, True),
    ({"Origin": "http://agent.example:9401"}, False),
    ({"Origin": "http://evil.example"}, False),
    ({"Origin": "http://agent.example.evil.example:9400"}, False),
    ({"Origin": "null"}, False),
    ({"Origin": "file://agent.example:9400"}, False),
    ({"Origin": "http://agent.example:9400", "Sec-Fetch-Site": "cross-site"}, False),
    ({"Origin": "http://agent.example:9400", "Sec-Fetch-Site": "same-site"}, False),
])
def test_same_origin_by_host(headers: dict[str, str], same: bool) -> None:
    """A post is the agent's own when its Origin (or Referer) names the Host it was sent to."""
    from aiohttp.test_utils import make_mocked_request

    request = make_mocked_request("POST", "/silences", headers={"Host": "agent.example:9400", **headers})
    assert same_origin(request) is same
