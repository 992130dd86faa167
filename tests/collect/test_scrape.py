"""Tests for agent.collect.scrape against real local HTTP servers: good payloads, bad input, staleness.

Every bad-input case checks two things: the bad target gets a clear error, and a
healthy target scraped in the same cycle is unaffected.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import itertools
import math
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from aiohttp import web
from pydantic import SecretStr

from agent.collect.discovery import TargetSpec, instance_of
from agent.collect.scrape import ACCEPT_HEADER, Scraper
from agent.config import BasicAuthConfig
from agent.series import is_stale, labels_from
from agent.store import AppendResult, KeepList, Series, SeriesMatcher, Store
from tests.alertmanager import eventually
from tests.conftest import FIXTURES, Handler
from tests.prometheus import Prometheus

TEXT = "text/plain; version=0.0.4; charset=utf-8"
GOOD = (
    "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
    "# TYPE vllm:num_requests_waiting gauge\n"
    'vllm:num_requests_waiting{engine="0",model_name="m"} 3.0\n'
    "# TYPE python_gc_objects_collected_total counter\n"
    'python_gc_objects_collected_total{generation="0"} 100.0\n'
)
Start = Callable[[Handler], Awaitable[str]]


def _reply(body: str | bytes, ctype: str = TEXT, status: int = 200, **headers: str) -> Handler:
    async def handler(_: web.Request) -> web.StreamResponse:
        data = body.encode() if isinstance(body, str) else body
        return web.Response(body=data, status=status, headers={"Content-Type": ctype, **headers})

    return handler


def _spec(url: str, **labels: str) -> TargetSpec:
    return TargetSpec(url=url, labels=tuple(sorted({"job": "vllm", "instance": instance_of(url), **labels}.items())))


def _scraper(store: Store | None = None, **kw: float) -> Scraper:
    st = store or Store(3_600_000, KeepList(["vllm:num_requests_waiting", "vllm:num_requests_running"]))
    args = {"timeout_s": 2.0, "body_limit": 1 << 20, "concurrency": 8, **kw}
    limits = {k: int(v) for k, v in kw.items() if k.endswith("_limit") and k != "body_limit"}
    return Scraper(st, timeout_s=args["timeout_s"], body_limit=int(args["body_limit"]),
                   concurrency=int(args["concurrency"]), **limits)


async def _pair(http_server: Start, bad: Handler, **kw: float) -> tuple[Scraper, str, str]:
    """One bad target and one good target, scraped in one cycle."""
    bad_url, good_url = await http_server(bad), await http_server(_reply(GOOD))
    sc = _scraper(**kw)
    sc.set_targets([_spec(bad_url), _spec(good_url)])
    await sc.scrape_all()
    good = sc.targets[good_url]
    assert good.health == "up" and good.stored == 1, good.last_error
    return sc, bad_url, good_url


def _values(store: Store, name: str, **match: str) -> list[float]:
    ms = [SeriesMatcher("__name__", "=", name), *(SeriesMatcher(k, "=", v) for k, v in match.items())]
    return [v for s in store.iter_series(ms) for v in s.vals]


async def test_scrape_stores_kept_families_with_target_labels(http_server: Start) -> None:
    """Kept samples get job/instance; other families are counted but not stored; up=1."""
    url = await http_server(_reply(GOOD))
    sc = _scraper()
    sc.set_targets([_spec(url, cluster="a")])
    await sc.scrape_all()
    t = sc.targets[url]
    assert (t.health, t.samples, t.stored) == ("up", 2, 1)
    labels = labels_from("vllm:num_requests_waiting", {"engine": "0", "model_name": "m", "job": "vllm",
                                                       "instance": instance_of(url), "cluster": "a"})
    s = sc.store.get(labels)
    assert s is not None and list(s.vals) == [3.0]
    assert _values(sc.store, "python_gc_objects_collected_total") == []
    assert _values(sc.store, "up", instance=instance_of(url)) == [1.0]
    assert _values(sc.store, "scrape_samples_scraped", instance=instance_of(url)) == [2.0]
    assert t.as_json()["health"] == "up" and t.as_json()["samples"] == 2
    await sc.close()


# Real vLLM /metrics pages (tests/fixtures/vllm, each with its source in its first lines), named here
# rather than globbed: a capture that goes missing fails its case instead of dropping out of the run.
VLLM_CAPTURES = ["v0_0.7_aibrix_qwen15b_metrics.txt", "v1_0.8_prodstack_qwen32b_metrics.txt"]


@pytest.mark.parametrize("capture", VLLM_CAPTURES)
async def test_real_vllm_capture_scrapes(http_server: Start, capture: str) -> None:
    """A real vLLM /metrics capture (V0 and V1 engine) scrapes with every kept family stored."""
    body = (FIXTURES / "vllm" / capture).read_text()
    url = await http_server(_reply(body))
    sc = _scraper(Store(3_600_000, KeepList(None)))
    sc.set_targets([_spec(url)])
    await sc.scrape_all()
    t = sc.targets[url]
    assert t.health == "up", t.last_error
    assert t.stored == t.samples > 20
    await sc.close()


async def _recording_headers(http_server: Start) -> tuple[str, dict[str, str]]:
    """A target serving GOOD that records the headers of the request it got."""
    seen: dict[str, str] = {}

    async def handler(req: web.Request) -> web.StreamResponse:
        seen.update(req.headers)
        return web.Response(text=GOOD, headers={"Content-Type": TEXT})

    return await http_server(handler), seen


async def test_request_headers(http_server: Start) -> None:
    """The scraper asks for the text format, offers gzip and sends the bearer token."""
    url, seen = await _recording_headers(http_server)
    sc = _scraper()
    sc.set_targets([TargetSpec(url, (("instance", "x"), ("job", "vllm")), bearer_token=SecretStr("tok"))])
    await sc.scrape_all()
    assert seen["Accept"] == ACCEPT_HEADER
    assert "gzip" in seen["Accept-Encoding"]
    assert seen["Authorization"] == "Bearer tok"
    assert seen["X-Prometheus-Scrape-Timeout-Seconds"] == "2"
    await sc.close()


async def test_gzip_body(http_server: Start) -> None:
    """A gzip-encoded payload is decompressed."""
    url = await http_server(_reply(gzip.compress(GOOD.encode()), **{"Content-Encoding": "gzip"}))
    sc = _scraper()
    sc.set_targets([_spec(url)])
    await sc.scrape_all()
    assert sc.targets[url].health == "up" and sc.targets[url].stored == 1
    await sc.close()


@pytest.mark.parametrize(
    ("handler", "error"),
    [
        (_reply('vllm:num_requests_waiting{model_name="m" 1\n'), "invalid exposition format: line 1"),
        (_reply("vllm:num_requests_waiting 1\nvllm:num_requests_running 2"), "invalid exposition format: line 2"),
        (_reply("vllm:num_requests_waiting one\n"), "invalid exposition format: line 1"),
        (_reply("not found", status=404), "HTTP status 404"),
        (_reply("boom", status=500), "HTTP status 500"),
        (_reply("<html></html>", ctype="text/html"), "unexpected Content-Type 'text/html'"),
        (_reply("x" * ((1 << 20) + 10)), "exceeds the limit of 1048576 bytes"),
        (_reply(b"vllm:num_requests_waiting 1\n\xff\xfe\n"), "not valid UTF-8"),
    ],
    ids=["malformed", "truncated", "bad-value", "404", "500", "html", "too-big", "not-utf8"],
)
async def test_bad_target_down_with_clear_error(http_server: Start, handler: Handler, error: str) -> None:
    """Each kind of bad response marks only that target down, with a readable error."""
    sc, bad, _ = await _pair(http_server, handler)
    t = sc.targets[bad]
    assert t.health == "down"
    assert error in t.last_error
    assert _values(sc.store, "up", instance=instance_of(bad)) == [0.0]
    assert _values(sc.store, "vllm:num_requests_waiting", instance=instance_of(bad)) == []  # atomic: nothing kept
    await sc.close()


async def test_hanging_target_does_not_delay_others(http_server: Start) -> None:
    """A target that accepts and never answers times out; the healthy one finishes on its own time."""
    release = asyncio.Event()

    async def hang(_: web.Request) -> web.StreamResponse:
        await release.wait()
        return web.Response(text="")

    sc, bad, good = await _pair(http_server, hang, timeout_s=1.0)
    assert "timed out after 1s" in sc.targets[bad].last_error
    assert sc.targets[good].duration_s < sc.targets[bad].duration_s
    release.set()
    await sc.close()


async def _hanging(http_server: Start, n: int) -> tuple[list[str], list[float], asyncio.Event]:
    """``n`` targets that take the request and answer only on ``release``; ``arrived`` gets each
    request's arrival time (the server's handler goes on waiting after the scraper gives up)."""
    arrived: list[float] = []
    release = asyncio.Event()

    async def hang(_: web.Request) -> web.StreamResponse:
        arrived.append(time.monotonic())
        await release.wait()
        return web.Response(text="")

    return [await http_server(hang) for _ in range(n)], arrived, release


async def test_concurrency_zero_scrapes_every_target_at_once(http_server: Start) -> None:
    """``scrape.concurrency: 0``: twelve hanging targets are all asked at once (as Prometheus' goroutine
    per target would), and the healthy one is scraped beside them, not after a slot frees up."""
    urls, arrived, release = await _hanging(http_server, 12)
    good_url = await http_server(_reply(GOOD))
    sc = _scraper(concurrency=0, timeout_s=60.0)
    sc.set_targets([*(_spec(u) for u in urls), _spec(good_url)])
    cycle = asyncio.create_task(sc.scrape_all())

    async def all_waiting() -> bool | None:
        await asyncio.sleep(0.02)
        return (len(arrived) == 12 and sc.targets[good_url].health == "up") or None

    await eventually(all_waiting, timeout=30, what="twelve hanging requests in flight and the healthy target up")
    release.set()
    await cycle
    await sc.close()


async def test_concurrency_caps_the_scrapes_in_flight(http_server: Start) -> None:
    """``scrape.concurrency: 4`` has at most four scrapes in flight: ten hanging targets with a 1 s timeout
    arrive in waves of four, each wave a timeout after the one before (lower bounds: a slow machine only
    widens the gaps)."""
    urls, arrived, release = await _hanging(http_server, 10)
    sc = _scraper(concurrency=4, timeout_s=1.0)
    sc.set_targets([_spec(u) for u in urls])
    await sc.scrape_all()
    release.set()
    assert len(arrived) == 10
    first = sorted(arrived)
    assert first[4] - first[0] >= 0.5 and first[8] - first[0] >= 1.5, [round(t - first[0], 2) for t in first]
    assert all("timed out" in t.last_error for t in sc.targets.values())
    await sc.close()


async def test_targets_that_hung_last_cycle_take_no_slot_of_those_that_answer(http_server: Start) -> None:
    """With two slots, two targets that hung in the last cycle wait out their timeouts in slots of their
    own in the next: the fast ones are all asked before the hung ones time out, not after."""
    fast_at: list[float] = []

    async def fast(_: web.Request) -> web.StreamResponse:
        fast_at.append(time.monotonic())
        return web.Response(text=GOOD, content_type="text/plain")

    hung, hung_at, release = await _hanging(http_server, 2)
    fast_urls = [await http_server(fast) for _ in range(4)]
    sc = _scraper(concurrency=2, timeout_s=0.5)
    sc.set_targets([*(_spec(u) for u in fast_urls), *(_spec(u) for u in hung)])  # the hanging ones last
    await sc.scrape_all()
    assert len(fast_at) == 4 and len(hung_at) == 2 and max(fast_at) < min(hung_at)  # the order given
    await sc.scrape_all()
    release.set()
    assert len(fast_at) == 8 and len(hung_at) == 4
    assert max(fast_at[4:]) < min(hung_at[2:]) + 0.25  # long before the hung ones time out (0.5 s) and free a slot
    assert all("timed out" in sc.targets[u].last_error for u in hung)
    await sc.close()


async def test_connection_refused(http_server: Start) -> None:
    """A closed port is reported as a connection failure."""
    url = await http_server(_reply(GOOD))
    sc = _scraper()
    dead = "http://127.0.0.1:1/metrics"
    sc.set_targets([_spec(dead), _spec(url)])
    await sc.scrape_all()
    assert sc.targets[dead].health == "down" and "connection failed" in sc.targets[dead].last_error
    assert sc.targets[url].health == "up"
    await sc.close()


async def test_special_values_escapes_and_utf8(http_server: Start) -> None:
    """NaN/+Inf/-Inf values and escaped, UTF-8 label values are stored exactly."""
    body = (
        'vllm:num_requests_waiting{model_name="a\\"b\\\\c\\nd"} NaN\n'
        'vllm:num_requests_waiting{model_name="modèle-名前"} +Inf\n'
        'vllm:num_requests_waiting{model_name="neg"} -Inf\n'
    )
    url = await http_server(_reply(body))
    sc = _scraper()
    sc.set_targets([_spec(url)])
    await sc.scrape_all()
    got = {dict(s.labels)["model_name"]: s.vals[0] for s in
           sc.store.iter_series([SeriesMatcher("__name__", "=", "vllm:num_requests_waiting")])}
    assert set(got) == {'a"b\\c\nd', "modèle-名前", "neg"}
    assert math.isnan(got['a"b\\c\nd']) and not is_stale(got['a"b\\c\nd'])
    assert got["modèle-名前"] == math.inf and got["neg"] == -math.inf
    await sc.close()


async def test_counter_reset_stored_as_is(http_server: Start) -> None:
    """A counter that drops (restart) is stored as scraped; rate() handles resets later."""
    values = iter(["10", "20", "3"])

    async def handler(_: web.Request) -> web.StreamResponse:
        return web.Response(text=f"vllm:num_requests_running {next(values)}\n", headers={"Content-Type": TEXT})

    url = await http_server(handler)
    clock = iter([1000.0, 1015.0, 1030.0, 1045.0, 1060.0, 1075.0])
    sc = Scraper(Store(3_600_000, KeepList(["vllm:num_requests_running"])), timeout_s=2, body_limit=1 << 20,
                 concurrency=4, clock=lambda: next(clock))
    sc.set_targets([_spec(url)])
    for _ in range(3):
        await sc.scrape_all()
    assert _values(sc.store, "vllm:num_requests_running") == [10.0, 20.0, 3.0]
    await sc.close()


async def test_duplicate_series_in_one_payload(http_server: Start) -> None:
    """The same series twice in one payload keeps the first value and counts a duplicate."""
    body = 'vllm:num_requests_waiting{a="1",b="2"} 1\nvllm:num_requests_waiting{b="2",a="1"} 2\n'
    url = await http_server(_reply(body))
    sc = _scraper()
    sc.set_targets([_spec(url)])
    await sc.scrape_all()
    assert sc.targets[url].health == "up"
    assert _values(sc.store, "vllm:num_requests_waiting") == [1.0]
    assert sc.store.rejected[AppendResult.DUPLICATE] == 1
    await sc.close()


async def test_clashing_label_becomes_exported(http_server: Start) -> None:
    """A scraped label named like a target label is kept as exported_<name>."""
    url = await http_server(_reply('vllm:num_requests_waiting{job="inner",instance=""} 1\n'))
    sc = _scraper()
    sc.set_targets([_spec(url)])
    await sc.scrape_all()
    (s,) = sc.store.iter_series([SeriesMatcher("__name__", "=", "vllm:num_requests_waiting")])
    assert dict(s.labels)["exported_job"] == "inner" and dict(s.labels)["job"] == "vllm"
    assert "exported_instance" not in dict(s.labels)  # empty label values are dropped
    await sc.close()


async def test_staleness_on_vanished_series_and_failed_scrape(http_server: Start) -> None:
    """A series missing from the next scrape, and every series of a failed scrape, get stale markers."""
    bodies = iter([
        'vllm:num_requests_waiting{engine="0"} 1\nvllm:num_requests_waiting{engine="1"} 1\n',
        'vllm:num_requests_waiting{engine="0"} 2\n',
        None,
    ])

    async def handler(_: web.Request) -> web.StreamResponse:
        body = next(bodies)
        if body is None:
            return web.Response(status=503)
        return web.Response(text=body, headers={"Content-Type": TEXT})

    url = await http_server(handler)
    clock = iter(float(t) for t in range(1000, 2000, 15))
    sc = Scraper(Store(3_600_000, KeepList(["vllm:num_requests_waiting"])), timeout_s=2, body_limit=1 << 20,
                 concurrency=4, clock=lambda: next(clock))
    sc.set_targets([_spec(url)])
    for _ in range(3):
        await sc.scrape_all()
    by_engine = {dict(s.labels)["engine"]: list(s.vals) for s in
                 sc.store.iter_series([SeriesMatcher("__name__", "=", "vllm:num_requests_waiting")])}
    assert by_engine["1"][0] == 1 and is_stale(by_engine["1"][1]) and len(by_engine["1"]) == 2
    assert by_engine["0"][:2] == [1, 2] and is_stale(by_engine["0"][2])
    await sc.close()


async def test_removed_target_marked_stale(http_server: Start) -> None:
    """Dropping a target from discovery marks its series and its up series stale."""
    url = await http_server(_reply(GOOD))
    sc = _scraper()
    sc.set_targets([_spec(url)])
    await sc.scrape_all()
    sc.set_targets([])
    up = _values(sc.store, "up")
    assert up[0] == 1.0 and is_stale(up[-1])
    assert is_stale(_values(sc.store, "vllm:num_requests_waiting")[-1])
    await sc.close()


async def test_sample_limit(http_server: Start) -> None:
    """More kept samples than scrape.sample_limit fails the scrape, Prometheus-style."""
    body = "".join(f'vllm:num_requests_waiting{{i="{i}"}} 1\n' for i in range(10))
    sc, bad, _ = await _pair(http_server, _reply(body), sample_limit=5)
    assert "sample limit exceeded: 10 > 5" in sc.targets[bad].last_error
    await sc.close()


async def test_hundred_thousand_series_from_one_target(http_server: Start) -> None:
    """A 100k-series payload is stored completely (keep-all) and again cheaply from the cache."""
    body = "# TYPE big gauge\n" + "".join(f'big{{i="{i}"}} {i}\n' for i in range(100_000))
    url = await http_server(_reply(body))
    store = Store(3_600_000, KeepList(None))
    sc = Scraper(store, timeout_s=30, body_limit=16 << 20, concurrency=4)
    sc.set_targets([_spec(url)])
    await sc.scrape_all()
    await sc.scrape_all()
    t = sc.targets[url]
    assert t.health == "up" and t.stored == 100_000 and len(t.cache) == 100_000
    assert store.stats()["series"] >= 100_000
    await sc.close()


async def test_openmetrics_response_accepted(http_server: Start) -> None:
    """A target that answers OpenMetrics anyway is parsed as OpenMetrics."""
    body = "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 4.0\n# EOF\n"
    url = await http_server(_reply(body, ctype="application/openmetrics-text; version=1.0.0; charset=utf-8"))
    sc = _scraper()
    sc.set_targets([_spec(url)])
    await sc.scrape_all()
    assert sc.targets[url].health == "up", sc.targets[url].last_error
    assert _values(sc.store, "vllm:num_requests_waiting") == [4.0]
    await sc.close()


class _BrokenForOne(Store):
    """A store whose series() raises for one instance's scraped series (not its synthetic ones)."""

    def __init__(self, broken_instance: str) -> None:
        super().__init__(3_600_000, _BoomKeep(["vllm:num_requests_waiting", "vllm:num_requests_running"]))
        self.broken = broken_instance

    def _check(self, labels: tuple[tuple[str, str], ...]) -> None:
        d = dict(labels)
        if d.get("instance") == self.broken and not d["__name__"].startswith(("up", "scrape_")):
            raise RuntimeError("injected store failure")

    def series(self, labels: tuple[tuple[str, str], ...]) -> Series:
        self._check(labels)
        return super().series(labels)

    def try_series(self, labels: tuple[tuple[str, str], ...]) -> Series | None:
        self._check(labels)
        return super().try_series(labels)


class _BoomKeep(KeepList):
    """A keep-list that raises while the parser asks about the name ``boom`` (a parser-side bug)."""

    def __missing__(self, sample_name: str) -> bool:
        if sample_name == "boom":
            raise KeyError("injected parse failure")
        return super().__missing__(sample_name)


async def test_unexpected_exception_marks_only_that_target_down(http_server: Start) -> None:
    """An exception that is no ScrapeError, from the store append or the parse of one target, marks
    only that target down with last_error and up=0; the cycle goes on and the others are stored."""
    good_urls = [await http_server(_reply(GOOD)) for _ in range(3)]
    store_bad = await http_server(_reply(GOOD))
    parse_bad = await http_server(_reply(GOOD + "boom 1\n"))
    store = _BrokenForOne(instance_of(store_bad))
    sc = _scraper(store)
    sc.set_targets([_spec(u) for u in (good_urls[0], store_bad, good_urls[1], parse_bad, good_urls[2])])
    for cycle in (1, 2):
        await sc.scrape_all()
        for url in good_urls:
            t = sc.targets[url]
            assert (t.health, t.stored, t.last_error) == ("up", 1, ""), cycle
            assert _values(store, "vllm:num_requests_waiting", instance=instance_of(url)) == [3.0] * cycle
            assert _values(store, "up", instance=instance_of(url)) == [1.0] * cycle
        for url, cause in ((store_bad, "RuntimeError: injected store failure"),
                           (parse_bad, "KeyError: 'injected parse failure'")):
            t = sc.targets[url]
            assert t.health == "down" and t.last_error == f"internal error while scraping: {cause}", cycle
            assert _values(store, "up", instance=instance_of(url)) == [0.0] * cycle
            assert t.failures == cycle
    await sc.close()


async def test_out_of_bounds_timestamps_dropped_per_sample(http_server: Start) -> None:
    """Samples more than 10m ahead of the scrape or older than retention are dropped alone (as
    Prometheus 2.42 does); the target stays up and says so; a non-int64 timestamp fails the scrape."""
    async def handler(_: web.Request) -> web.StreamResponse:
        now = int(time.time() * 1000)
        body = "".join(f'vllm:num_requests_waiting{{at="{name}"}} 1 {now + delta}\n' for name, delta in (
            ("ahead_9m", 9 * 60_000), ("ahead_1h", 3_600_000), ("ahead_30d", 30 * 86_400_000),
            ("before_retention", -2 * 3_600_000))) + 'vllm:num_requests_waiting{at="none"} 1\n'
        return web.Response(text=body, headers={"Content-Type": TEXT})

    url = await http_server(handler)
    int64 = await http_server(_reply("vllm:num_requests_waiting 1 99999999999999999999\n"))
    sc = _scraper()
    sc.set_targets([_spec(url), _spec(int64)])
    await sc.scrape_all()
    t = sc.targets[url]
    assert t.health == "up" and t.stored == 2 and t.out_of_bounds == 3
    assert t.last_error.startswith("3 sample(s) out of bounds (timestamp more than 10m after the scrape")
    assert sorted(dict(s.labels)["at"] for s in sc.store.iter_series([SeriesMatcher("at", "!=", "")])) == [
        "ahead_9m", "none"]
    assert _values(sc.store, "up", instance=instance_of(url)) == [1.0]
    assert sc.targets[int64].health == "down" and "timestamp" in sc.targets[int64].last_error
    await sc.close()


async def test_basic_auth_header_sent(http_server: Start) -> None:
    """A target with basic_auth is scraped with the Authorization: Basic header."""
    url, seen = await _recording_headers(http_server)
    sc = _scraper()
    auth = BasicAuthConfig(username="bob", password=SecretStr("pa:ss"))
    sc.set_targets([TargetSpec(url, (("instance", "x"), ("job", "vllm")), basic_auth=auth)])
    await sc.scrape_all()
    assert sc.targets[url].health == "up", sc.targets[url].last_error
    assert seen["Authorization"] == "Basic " + base64.b64encode(b"bob:pa:ss").decode()
    assert "pa:ss" not in repr(sc.targets[url]) and "pa:ss" not in str(sc.targets_json())
    await sc.close()


@pytest.mark.parametrize(("limit", "body", "error"), [
    ("label_limit", 'vllm:num_requests_waiting{a="1",b="2",c="3"} 1\n',
     "label_limit exceeded (metric: vllm:num_requests_waiting, number of labels: 6, limit: 5)"),
    ("label_name_length_limit", 'vllm:num_requests_waiting{abcdefghijklmnopqrstuvwxyz="1"} 1\n',
     "label_name_length_limit exceeded (metric: vllm:num_requests_waiting, label name: "
     "abcdefghijklmnopqrstuvwxyz, length: 26, limit: 25)"),
    ("label_value_length_limit", 'vllm:num_requests_waiting{model_name="q\\"' + "x" * 60 + '"} 1\n',
     'label_value_length_limit exceeded (metric: vllm:num_requests_waiting, label name: model_name, '
     'value: "q\\"' + "x" * 48 + '", length: 62, limit: 25)'),
])
async def test_label_limits_fail_the_scrape_with_prometheus_messages(
        http_server: Start, limit: str, body: str, error: str) -> None:
    """Over label_limit or a label name/value length limit the scrape fails with Prometheus 2.42's message
    (metric and name cut to 50, the value quoted, lengths in bytes); nothing of it is stored."""
    # the good target's series has 5 labels (__name__, engine, instance, job, model_name), none over 25 bytes
    sc, bad, _ = await _pair(http_server, _reply(body), **{limit: 5 if limit == "label_limit" else 25})
    t = sc.targets[bad]
    assert t.health == "down" and t.last_error == error
    assert _values(sc.store, "vllm:num_requests_waiting", instance=instance_of(bad)) == []
    assert _values(sc.store, "up", instance=instance_of(bad)) == [0.0]
    await sc.close()


async def test_new_series_limit_counts_series_new_to_the_store(http_server: Start) -> None:
    """More series new to the store than new_series_limit fails the scrape; series the store holds
    already (a target back after a failed scrape emptied its cache) do not count."""
    n = [0]

    async def churn(_: web.Request) -> web.StreamResponse:  # 8 new series every scrape
        n[0] += 1
        body = "".join(f'vllm:num_requests_waiting{{req="{n[0]}-{i}"}} 1\n' for i in range(8))
        return web.Response(text=body, headers={"Content-Type": TEXT})

    steady = "".join(f'vllm:num_requests_waiting{{i="{i}"}} 1\n' for i in range(8))
    churn_url, steady_url = await http_server(churn), await http_server(_reply(steady))
    sc = _scraper(new_series_limit=8)
    sc.set_targets([_spec(churn_url), _spec(steady_url)])
    await sc.scrape_all()
    assert sc.targets[churn_url].health == sc.targets[steady_url].health == "up"
    sc.new_series_limit = 7
    await sc.scrape_all()
    t = sc.targets[churn_url]
    assert t.health == "down"
    assert t.last_error == ("new series limit exceeded: more than 7 series new to the store in one scrape "
                            "(scrape.new_series_limit)")
    assert sc.targets[steady_url].health == "up"
    sc.targets[steady_url].cache.clear()  # as a failed scrape leaves it: every text is new to the cache
    await sc.scrape_all()
    assert sc.targets[steady_url].health == "up" and sc.targets[steady_url].stored == 8
    churned = sc.store.iter_series([SeriesMatcher("instance", "=", instance_of(churn_url)),
                                    SeriesMatcher("__name__", "=", "vllm:num_requests_waiting")])
    assert len(list(churned)) == 8  # the first scrape's; none of the refused scrapes' series
    await sc.close()


async def test_full_store_refuses_new_series_alone_and_keeps_up_truthful(http_server: Start) -> None:
    """With store.max_series reached, a target's new series are refused and counted while its existing
    series and every target's up and scrape_* series are still written."""
    store = Store(3_600_000, KeepList(None), max_series=3 + 4)  # the first target's 3 series + its 4 synthetic
    first = await http_server(_reply("".join(f'a{{i="{i}"}} 1\n' for i in range(3))))
    second = await http_server(_reply('b{i="0"} 1\nb{i="1"} 1\n'))
    # The six samples of `a` need both cycles of the first target. Once, on 2 busy cores, only three were
    # there: a second cycle that hit the 2 s timeout or stamped the first one's millisecond explains it, so
    # the clock moves a second per reading and the timeout is one a loaded machine does not reach.
    ticks = itertools.count(1_700_000_000)
    sc = Scraper(store, timeout_s=30.0, body_limit=1 << 20, concurrency=8, clock=lambda: float(next(ticks)))
    sc.set_targets([_spec(first)])
    await sc.scrape_all()
    sc.set_targets([_spec(first), _spec(second)])
    await sc.scrape_all()
    t = sc.targets[second]
    assert t.health == "up" and t.stored == 0 and t.refused_series == 2 and store.refused_series == 2
    assert t.last_error == "2 new series refused: the store holds store.max_series=7 series"
    assert _values(store, "up", instance=instance_of(second)) == [1.0]
    assert _values(store, "a") == [1.0] * 6
    assert sc.targets[first].health == "up" and sc.targets[first].last_error == ""
    await sc.close()


LIMIT_CASES = {  # Prometheus scrape_config limit -> (value, payload over it)
    "label_limit": (5, 'vllm:num_requests_waiting{a="1",b="2",c="3"} 1\n'),
    "label_name_length_limit": (25, 'vllm:num_requests_waiting{abcdefghijklmnopqrstuvwxyz="1"} 1\n'),
    "label_value_length_limit": (25, 'vllm:num_requests_waiting{model_name="q\\"' + "x" * 60 + '"} 1\n'),
}


async def test_limits_and_time_bounds_match_real_prometheus(http_server: Start, tmp_path: Path) -> None:
    """The same payloads scraped by a real Prometheus 2.42 and by the agent: identical lastError for each
    label limit; a sample 1h ahead is dropped and one 9m ahead kept by both, the target staying up."""
    async def ahead(_: web.Request) -> web.StreamResponse:
        now = int(time.time() * 1000)
        body = (f'vllm:num_requests_waiting{{at="9m"}} 1 {now + 9 * 60_000}\n'
                f'vllm:num_requests_waiting{{at="1h"}} 1 {now + 3_600_000}\n')
        return web.Response(text=body, headers={"Content-Type": TEXT})

    urls = {name: await http_server(_reply(body)) for name, (_, body) in LIMIT_CASES.items()}
    urls["ahead"] = await http_server(ahead)
    jobs = [{"job_name": name, "static_configs": [{"targets": [instance_of(url)]}],
             **({name: LIMIT_CASES[name][0]} if name in LIMIT_CASES else {})} for name, url in urls.items()]
    async with Prometheus(tmp_path, [], scrape_configs=jobs) as prom:
        async def scraped() -> dict[str, dict[str, Any]] | None:
            active = (await prom.api("targets"))["activeTargets"]
            done = {t["scrapePool"]: t for t in active if t["health"] != "unknown"}
            return done if len(done) == len(urls) else None

        theirs = await eventually(scraped, what="Prometheus to scrape every target")
        ahead_kept = await eventually(
            lambda: _query(prom, 'vllm:num_requests_waiting{job="ahead"}', time.time() + 9 * 60),
            what="the +9m sample in Prometheus")
        assert [r["metric"]["at"] for r in ahead_kept] == ["9m"]
        assert await _query(prom, 'vllm:num_requests_waiting{job="ahead"}', time.time() + 3600, empty=True) == []
    for name, url in urls.items():
        limit = {name: LIMIT_CASES[name][0]} if name in LIMIT_CASES else {}
        sc = _scraper(**limit)
        sc.set_targets([_spec(url)])
        await sc.scrape_all()
        ours = sc.targets[url]
        if name in LIMIT_CASES:
            assert ours.health == theirs[name]["health"] == "down", name
            assert ours.last_error == theirs[name]["lastError"] and ours.last_error.startswith(f"{name} exceeded")
        else:
            assert ours.health == theirs[name]["health"] == "up" and ours.out_of_bounds == 1
            assert [dict(x.labels)["at"] for x in sc.store.iter_series([SeriesMatcher("at", "!=", "")])] == ["9m"]
        await sc.close()


async def _query(prom: Prometheus, expr: str, at: float, *, empty: bool = False) -> list[Any] | None:
    result: list[Any] = (await prom.api(f"query?query={quote(expr)}&time={at}"))["result"]
    return result if result or empty else None
