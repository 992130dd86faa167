"""Incident triage reports: what happened, why, and what the agent already did, on one page.

One incident's report holds its timeline (pending, firing, each notification per receiver with
its outcome and attempts, scale actions with from/to replicas, findings, silences, resolved), its
rule's expression and threshold, plots of the firing series and of the context around it, the
findings with their setting, value and runbook, and a summary written from those facts.

* :mod:`.facts` reads the state database and the rules; :mod:`.rule` splits the rule's comparison;
* :mod:`.timeline` and :mod:`.summary` turn the facts into rows and sentences;
* :mod:`.series` chooses the plots' range queries and runs them on the store or the source;
  :mod:`.plots` draws them (matplotlib);
* :mod:`.report` puts one report together; :mod:`.render` writes it as HTML, Markdown or JSON;
* :mod:`.service` serves them from the daemon (``GET /incidents/{id}``), off the event loop, cached.

The CLI (``sre-agent triage``, :mod:`agent.cli.triage`) builds the same report from the state
database and the source, or asks the running agent.
"""

from __future__ import annotations

from agent.app.triage.render import CONTENT_TYPES, CSP, FORMATS, render
from agent.app.triage.report import Report, build
from agent.app.triage.service import Reports

__all__ = ["CONTENT_TYPES", "CSP", "FORMATS", "Report", "Reports", "build", "render"]
