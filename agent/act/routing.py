"""Which receivers and actions an alert goes to: Alertmanager's route tree, grouping and silences.

The dispatcher asks a :class:`Router` (built once from the config, matchers compiled
once) where each alert goes. The semantics are Alertmanager 0.25's, so a tree written
for Alertmanager routes the same here, which ``tests/act/test_routing.py`` checks against
``amtool config routes test``:

* children inherit ``receiver``, ``group_by``, ``group_wait``, ``group_interval``,
  ``repeat_interval`` and ``send_resolved`` from their parent unless they set them; as
  in Alertmanager an empty ``group_by: []`` counts as unset (inherits), and the root's
  defaults are Alertmanager's (30s, 5m, 4h, no grouping labels);
* :func:`match_routes` is ``dispatch.Route.Match``: depth first, a matching child
  without ``continue`` stops its later siblings, a node none of whose children match is
  itself the result;
* a group is the route plus the alert's values of the route's ``group_by`` labels
  (``...``: all labels); an empty label value counts as absent, as everywhere in
  Prometheus.

Actions (scale-out, diagnose) are not part of the tree: every action whose matchers
hold runs, beside the notifications. Everything here is pure: no I/O, no clock.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol, TypeVar

import structlog

from agent.errors import ConfigError
from agent.matchers import AlertMatcher, matchers_from, matches_all, parse_matcher

if TYPE_CHECKING:
    from agent.config import ActionConfig, Config, RouteConfig

__all__ = [
    "Route",
    "Router",
    "SilenceLike",
    "active_silences",
    "build_route_tree",
    "group_for",
    "match_actions",
    "match_routes",
    "muted_by",
    "silenced_by",
]

log = structlog.get_logger(__name__)
_T = TypeVar("_T")

# Alertmanager's DefaultRouteOpts (dispatch/route.go); send_resolved is ours (per route, not per receiver).
_DEFAULT_GROUP_WAIT_S = 30.0
_DEFAULT_GROUP_INTERVAL_S = 300.0
_DEFAULT_REPEAT_INTERVAL_S = 4 * 3600.0
_DEFAULT_SEND_RESOLVED = True
_GROUP_BY_ALL = "..."
_LABEL_NAME_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


@dataclass(frozen=True)
class Route:
    """A :class:`~agent.config.RouteConfig` with inheritance resolved and matchers compiled."""

    path: str  # "root", "root.0", "root.0.1": the index path, stable while the config is; part of group keys
    receiver: str
    matchers: tuple[AlertMatcher, ...]
    group_by: tuple[str, ...] | None  # None: group by all labels ("..." in the config)
    group_wait_s: float
    group_interval_s: float
    repeat_interval_s: float
    send_resolved: bool
    continue_: bool
    routes: tuple[Route, ...]

    def walk(self) -> list[Route]:
        """This route and every route below it, depth first (the config's order)."""
        out = [self]
        for child in self.routes:
            out.extend(child.walk())
        return out


class SilenceLike(Protocol):
    """What :func:`silenced_by` needs of a silence (``agent.act.state.Silence`` has it)."""

    @property
    def id(self) -> str: ...

    @property
    def matchers(self) -> Sequence[str]: ...

    def active(self, now_ms: int) -> bool: ...


def build_route_tree(cfg: RouteConfig) -> Route:
    """Resolve inheritance and compile matchers; ``ConfigError`` for a tree Alertmanager would refuse."""
    errors: list[str] = []
    if cfg.receiver is None:
        errors.append("route.receiver: the root route needs a receiver")
    if cfg.matchers or cfg.match or cfg.match_re:
        errors.append("route: the root route must not have matchers (it receives every alert)")
    if cfg.continue_:
        errors.append("route.continue: the root route cannot have continue")
    root = _build(cfg, None, "root", "route", errors)
    if errors:
        raise ConfigError(errors)
    return root


def _build(cfg: RouteConfig, parent: Route | None, path: str, key: str, errors: list[str]) -> Route:
    group_by: tuple[str, ...] | None = () if parent is None else parent.group_by
    if cfg.group_by:  # Alertmanager: an empty list is the same as no group_by
        errors.extend(_group_by_errors(cfg.group_by, key))
        group_by = None if _GROUP_BY_ALL in cfg.group_by else tuple(cfg.group_by)
    for name in ("group_interval", "repeat_interval"):
        value = getattr(cfg, name)
        if value is not None and value <= 0:
            errors.append(f"{key}.{name}: must be greater than zero")
    try:
        matchers = tuple(matchers_from(cfg.matchers, cfg.match, cfg.match_re))
    except ValueError as exc:
        errors.append(f"{key}.matchers: {exc}")
        matchers = ()
    node = Route(  # routes filled in below: the children inherit from this node
        path=path,
        receiver=cfg.receiver or (parent.receiver if parent else ""),
        matchers=matchers,
        group_by=group_by,
        group_wait_s=_pick(cfg.group_wait, parent.group_wait_s if parent else _DEFAULT_GROUP_WAIT_S),
        group_interval_s=_pick(cfg.group_interval, parent.group_interval_s if parent else _DEFAULT_GROUP_INTERVAL_S),
        repeat_interval_s=_pick(cfg.repeat_interval,
                                parent.repeat_interval_s if parent else _DEFAULT_REPEAT_INTERVAL_S),
        send_resolved=_pick(cfg.send_resolved, parent.send_resolved if parent else _DEFAULT_SEND_RESOLVED),
        continue_=cfg.continue_,
        routes=(),
    )
    children = tuple(_build(c, node, f"{path}.{i}", f"{key}.routes[{i}]", errors) for i, c in enumerate(cfg.routes))
    return replace(node, routes=children)


def _pick(value: _T | None, inherited: _T) -> _T:
    return inherited if value is None else value


def _group_by_errors(group_by: Sequence[str], key: str) -> list[str]:
    errors = []
    if _GROUP_BY_ALL in group_by and len(group_by) > 1:
        errors.append(f"{key}.group_by: cannot have '...' (all labels) and other labels at the same time")
    for name in group_by:
        if name != _GROUP_BY_ALL and _LABEL_NAME_RE.fullmatch(name) is None:
            errors.append(f"{key}.group_by: invalid label name {name!r}")
    dupes = sorted({n for n in group_by if group_by.count(n) > 1})
    if dupes:
        errors.append(f"{key}.group_by: duplicated label(s) {', '.join(dupes)}")
    return errors


def match_routes(root: Route, labels: Mapping[str, str]) -> list[Route]:
    """The routes an alert with ``labels`` is delivered through, in the tree's order (the root always matches)."""
    return _match_children(root, labels)


def _match_children(route: Route, labels: Mapping[str, str]) -> list[Route]:
    found: list[Route] = []
    for child in route.routes:
        if not matches_all(child.matchers, labels):
            continue
        found.extend(_match_children(child, labels))
        if not child.continue_:
            break
    return found or [route]


def group_for(route: Route, labels: Mapping[str, str]) -> tuple[str, dict[str, str]]:
    """``(group_key, group_labels)`` of an alert on ``route``.

    The group labels are the alert's values for the route's ``group_by`` (labels the alert
    lacks are left out, as in Alertmanager), or all its labels for ``...``; the key is
    ``'<route path>:{a="1", b="2"}'`` with the labels sorted, so it is stable across restarts.
    """
    names = labels.keys() if route.group_by is None else route.group_by
    group = {k: labels[k] for k in sorted(names) if labels.get(k, "") != ""}
    body = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in group.items())
    return f"{route.path}:{{{body}}}", group


def active_silences(silences: Iterable[SilenceLike], now_ms: int) -> list[tuple[str, tuple[AlertMatcher, ...]]]:
    """The silences in effect at ``now_ms`` as ``(id, parsed matchers)``, parsed once for a flush.

    A silence without matchers silences nothing (Alertmanager refuses to create one); one
    with a matcher that does not parse is logged and skipped, so it cannot stop delivery.
    """
    out = []
    for s in silences:
        if not s.matchers or not s.active(now_ms):
            continue
        try:
            out.append((s.id, tuple(parse_matcher(t) for t in s.matchers)))
        except ValueError as exc:
            log.warning("silence skipped, bad matcher", silence_id=s.id, error=str(exc))
    return out


def muted_by(labels: Mapping[str, str], active: Iterable[tuple[str, tuple[AlertMatcher, ...]]]) -> list[str]:
    """Ids of the :func:`active_silences` whose matchers all match ``labels``."""
    return [sid for sid, ms in active if matches_all(ms, labels)]


def silenced_by(labels: Mapping[str, str], silences: Iterable[SilenceLike], now_ms: int) -> list[str]:
    """Ids of the silences active at ``now_ms`` whose matchers all match ``labels``."""
    return muted_by(labels, active_silences(silences, now_ms))


def match_actions(actions: Sequence[ActionConfig], labels: Mapping[str, str]) -> list[ActionConfig]:
    """Every action whose ``matchers``, ``match`` and ``match_re`` all hold (one without any runs for every alert)."""
    return [a for a in actions if matches_all(matchers_from(a.matchers, a.match, a.match_re), labels)]


class Router:
    """The route tree and the actions of one config, matchers compiled once; what the dispatcher holds."""

    def __init__(self, config: Config) -> None:
        self.root = build_route_tree(config.route)
        self._actions = [(a, tuple(matchers_from(a.matchers, a.match, a.match_re))) for a in config.actions]
        log.debug("router built", routes=len(self.root.walk()), actions=len(self._actions))

    def routes_for(self, labels: Mapping[str, str]) -> list[Route]:
        """See :func:`match_routes`."""
        return match_routes(self.root, labels)

    def actions_for(self, labels: Mapping[str, str]) -> list[ActionConfig]:
        """See :func:`match_actions`."""
        return [a for a, ms in self._actions if matches_all(ms, labels)]
