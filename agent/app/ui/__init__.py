"""The agent's built-in web UI at ``/``: alerts, targets, rules, incidents, silences and status.

Server-rendered HTML (jinja2, autoescaped) with a little progressive JavaScript that polls
the page; no build step and nothing from another origin, so it works with no internet. It
reads the same daemon view as the JSON API. :mod:`.pages` holds the handlers,
:mod:`.present` shapes the API's JSON for the templates, :mod:`.security` the browser
session, CSRF and Origin checks and the Content-Security-Policy.
"""

from __future__ import annotations

from agent.app.ui.pages import NAV, SESSIONS, UiView, add_ui, bypasses_bearer
from agent.app.ui.security import CSP, Sessions

__all__ = ["CSP", "NAV", "SESSIONS", "Sessions", "UiView", "add_ui", "bypasses_bearer"]
