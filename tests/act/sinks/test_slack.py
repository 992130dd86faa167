"""Slack receiver: Block Kit builders, and the sink against the local fake Slack (tests/fake_slack.py)."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import SecretStr
from structlog.testing import capture_logs

from agent.act.notification import AlertSnapshot, Notification
from agent.act.sinks.slack import SlackSink
from agent.act.sinks.slack_blocks import alert_blocks, escape, finding_blocks, truncate
from agent.config import SlackReceiverConfig
from agent.errors import DeliveryError
from tests.fake_slack import FakeSlack, running_fake_slack

CHANNEL_ID = "C0123ABCD"  # what the fake calls #alerts
GROUP = '{}:{alertname="VLLMKVCacheSaturated"}'
RUNBOOK = "https://example.com/runbooks/VLLMKVCacheSaturated.md"


class DictRefs:
    """MessageRefs in a dict (the daemon uses agent.act.WriterRefs over the state database)."""

    def __init__(self) -> None:
        self.refs: dict[tuple[str, str], tuple[str, str]] = {}

    async def get_ref(self, receiver: str, group_key: str) -> tuple[str, str] | None:
        return self.refs.get((receiver, group_key))

    async def put_ref(self, receiver: str, group_key: str, channel: str, ts: str) -> None:
        self.refs[(receiver, group_key)] = (channel, ts)

    async def delete_ref(self, receiver: str, group_key: str) -> None:
        self.refs.pop((receiver, group_key), None)


class FakeTime:
    """An injected clock that only moves when the sink sleeps; every sleep is recorded."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with running_fake_slack() as fake:
        yield fake


def alert(status: str = "firing", *, value: float = 0.97, instance: str = "10.0.0.1:8000",
          **extra: str) -> AlertSnapshot:
    labels = {"alertname": "VLLMKVCacheSaturated", "severity": "warning", "instance": instance,
              "model_name": "meta-llama/Llama-3-8B", "job": "vllm", **extra}
    annotations = {"summary": "KV cache almost full.", "description": f"KV cache on {instance} is {value:.0%} used.",
                   "runbook_url": RUNBOOK}
    return AlertSnapshot(labels=labels, annotations=annotations, status=status,
                         starts_at_ms=1_700_000_000_000, ends_at_ms=1_700_000_600_000 if status == "resolved" else 0,
                         value=value)


def group(*alerts: AlertSnapshot, key: str = "n1", group_key: str = GROUP) -> Notification:
    status = "firing" if any(a.status == "firing" for a in alerts) else "resolved"
    return Notification(key=key, receiver="slack", kind="alerts", created_ms=1_700_000_000_000, group_key=group_key,
                        group_labels={"alertname": "VLLMKVCacheSaturated"}, status=status,
                        alerts=tuple(alerts))


def finding_note(key: str = "f1", group_key: str = GROUP) -> Notification:
    finding = {"kind": "gpu-oom-runtime", "summary": "vLLM ran out of GPU memory while allocating the KV cache.",
               "severity": "critical", "ok": False,
               "evidence": ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"],
               "setting": "--gpu-memory-utilization", "suggested_value": "0.85", "details": {},
               "runbook_url": "https://example.com/runbooks/diagnosis-gpu-oom-runtime.md", "labels": {"gpu": "0"}}
    return Notification(key=key, receiver="slack", kind="finding", created_ms=1_700_000_000_000, group_key=group_key,
                        finding=finding)


def bot_config(fake: FakeSlack, **extra: Any) -> SlackReceiverConfig:
    fields: dict[str, Any] = {"token": SecretStr(fake.token), "channel": "#alerts", "api_url": fake.api_url,
                              "dashboard_url": "https://grafana.example.com/d/vllm", **extra}
    return SlackReceiverConfig(**fields)


class Sinks:
    """The SlackSinks one test makes, on an injected clock; the :func:`sinks` fixture closes them all."""

    def __init__(self) -> None:
        self.made: list[SlackSink] = []

    def add(self, sink: SlackSink) -> SlackSink:
        """Close ``sink`` at teardown; returns it."""
        self.made.append(sink)
        return sink

    def bot(self, fake: FakeSlack, refs: DictRefs | None = None, ft: FakeTime | None = None,
            **extra: Any) -> SlackSink:
        """A bot-token sink posting to #alerts on ``fake``; ``extra`` are more SlackReceiverConfig fields."""
        ft = ft or FakeTime()
        return self.add(SlackSink("slack", bot_config(fake, **extra), refs or DictRefs(), clock=ft.clock,
                                  sleep=ft.sleep))

    def webhook(self, fake: FakeSlack, ft: FakeTime | None = None) -> SlackSink:
        """An incoming-webhook sink on ``fake``."""
        ft = ft or FakeTime()
        config = SlackReceiverConfig(webhook_url=SecretStr(fake.webhook_url))
        return self.add(SlackSink("hook", config, DictRefs(), clock=ft.clock, sleep=ft.sleep))


@pytest.fixture
async def sinks() -> AsyncIterator[Sinks]:
    """Make sinks with ``sinks.bot(...)``, ``sinks.webhook(...)`` or ``sinks.add(...)``; each is closed at teardown,
    failed test or not."""
    made = Sinks()
    yield made
    for sink in made.made:
        await sink.close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- pure builders -------------------------------------------------------------------


def test_escape_replaces_slack_control_characters() -> None:
    """&, < and > become entities (& first, so entities are not double-escaped)."""
    assert escape("<!channel> & <@U1>") == "&lt;!channel&gt; &amp; &lt;@U1&gt;"


def test_truncate_ends_in_ellipsis_at_the_limit() -> None:
    """Text over the limit is cut to exactly the limit, the last character being '…'."""
    assert truncate("abcdef", 6) == "abcdef"
    assert truncate("abcdefg", 6) == "abcde…"


def test_alert_blocks_layout_for_one_firing_alert() -> None:
    """Header with count and severity emoji, summary+description, key fields, other labels, two buttons."""
    text, blocks = alert_blocks(group(alert()), "https://grafana.example.com/d/vllm")
    assert text == "[FIRING:1] VLLMKVCacheSaturated: KV cache almost full."
    assert [b["type"] for b in blocks] == ["header", "section", "section", "context", "actions"]
    assert blocks[0]["text"]["text"] == ":warning: [FIRING:1] VLLMKVCacheSaturated"
    assert blocks[1]["text"]["text"] == "*KV cache almost full.*\nKV cache on 10.0.0.1:8000 is 97% used."
    fields = [f["text"] for f in blocks[2]["fields"]]
    # 1_700_000_000 s is 2023-11-14 22:13:20 UTC.
    assert fields == ["*Value*\n0.97", "*Instance*\n10.0.0.1:8000", "*Model*\nmeta-llama/Llama-3-8B",
                      "*Severity*\nwarning", "*Since*\n2023-11-14 22:13:20 UTC"]
    assert blocks[3]["elements"][0]["text"] == "job=vllm"
    buttons = [(e["text"]["text"], e["url"]) for e in blocks[4]["elements"]]
    assert buttons == [("Runbook", RUNBOOK), ("Dashboard", "https://grafana.example.com/d/vllm")]


def test_alert_blocks_resolved_group() -> None:
    """An all-resolved group says [RESOLVED] with a check mark and when it resolved."""
    text, blocks = alert_blocks(group(alert("resolved"), alert("resolved", instance="10.0.0.2:8000")))
    assert text.startswith("[RESOLVED] VLLMKVCacheSaturated")
    assert blocks[0]["text"]["text"] == ":white_check_mark: [RESOLVED] VLLMKVCacheSaturated"
    fields = [f["text"] for f in blocks[2]["fields"]]
    assert "*Instance*\n10.0.0.1:8000, 10.0.0.2:8000" in fields
    assert "*Resolved*\n2023-11-14 22:23:20 UTC" in fields  # 1_700_000_600_000 ms
    assert "*Alerts*\n0 firing, 2 resolved" in fields
    assert [b["type"] for b in blocks][-1] == "actions"
    assert [e["text"]["text"] for e in blocks[-1]["elements"]] == ["Runbook"]  # no dashboard configured


def test_alert_blocks_respect_block_kit_limits() -> None:
    """Header ≤ 150, section ≤ 3000, ≤ 10 fields of ≤ 2000, long URLs drop the button; cuts end in '…'."""
    long_name = "A" * 200
    big = alert(instance="i" * 2500, gpu="g" * 10, extra_label="x" * 5000)
    big = AlertSnapshot(labels={**big.labels, "alertname": long_name},
                        annotations={"summary": "s", "description": "d" * 5000,
                                     "runbook_url": "https://example.com/" + "r" * 3000},
                        status="firing", starts_at_ms=big.starts_at_ms, value=1.0)
    n = Notification(key="k", receiver="slack", kind="alerts", created_ms=0, group_key="g", alerts=(big,))
    _, blocks = alert_blocks(n, "https://grafana.example.com/d/vllm")
    header = blocks[0]["text"]["text"]
    assert len(header) == 150 and header.endswith("…")
    section = blocks[1]["text"]["text"]
    assert len(section) == 3000 and section.endswith("…")
    fields = blocks[2]["fields"]
    assert len(fields) <= 10
    instance = next(f["text"] for f in fields if f["text"].startswith("*Instance*"))
    assert len(instance) == 2000 and instance.endswith("…")
    context = blocks[3]["elements"][0]["text"]
    assert len(context) == 3000 and context.endswith("…")
    assert [e["text"]["text"] for e in blocks[4]["elements"]] == ["Dashboard"]  # the 3019-char runbook URL is dropped


def test_alert_blocks_cut_never_splits_an_entity() -> None:
    """A cut through escaped text drops a half entity instead of showing '&am…'."""
    a = alert()
    a = AlertSnapshot(labels=a.labels, annotations={"description": "&" * 4000}, status="firing", starts_at_ms=0)
    _, blocks = alert_blocks(group(a))
    # "&amp;" is 5 chars; 2999 chars hold 599 whole entities and "&amp", which is dropped.
    assert blocks[1]["text"]["text"] == "&amp;" * 599 + "…"


def test_alert_blocks_escape_user_text() -> None:
    """Label values and annotations cannot ping: <!channel> and & arrive escaped everywhere mrkdwn is parsed."""
    a = alert(team="<!channel>")
    a = AlertSnapshot(labels={**a.labels, "instance": "<!here>"},
                      annotations={"summary": "R&D <@U123>", "description": "<!channel> look"},
                      status="firing", starts_at_ms=0)
    text, blocks = alert_blocks(group(a))
    payload = json.dumps({"text": text, "blocks": blocks})
    for raw in ("<!channel>", "<!here>", "<@U123>", "R&D"):
        assert raw not in payload
    assert text == "[FIRING:1] VLLMKVCacheSaturated: R&amp;D &lt;@U123&gt;"
    assert blocks[1]["text"]["text"] == "*R&amp;D &lt;@U123&gt;*\n&lt;!channel&gt; look"
    assert "team=&lt;!channel&gt;" in blocks[3]["elements"][0]["text"]


def test_finding_blocks_layout() -> None:
    """Kind, summary, evidence in a code block, setting → suggested value, runbook button."""
    text, blocks = finding_blocks(finding_note().finding or {})
    assert text == ("Finding gpu-oom-runtime: vLLM ran out of GPU memory while allocating the KV cache. "
                    "(--gpu-memory-utilization → 0.85)")
    assert blocks[0]["text"]["text"] == ":rotating_light: Finding: gpu-oom-runtime"
    assert blocks[2]["text"]["text"] == (
        "```\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n```")
    fields = [f["text"] for f in blocks[3]["fields"]]
    assert fields == ["*Change*\n`--gpu-memory-utilization` → `0.85`", "*Severity*\ncritical", "*GPU*\n0"]
    assert blocks[-1]["elements"][0]["url"] == "https://example.com/runbooks/diagnosis-gpu-oom-runtime.md"


def test_finding_alternatives_follow_the_change() -> None:
    """A finding's other workable changes (details["alternatives"]) are a context line after the Change field."""
    finding = {**(finding_note().finding or {}), "details": {"alternatives": ["--max-num-seqs 128: fewer sequences",
                                                                             "--enable-chunked-prefill"]}}
    _, blocks = finding_blocks(finding)
    assert "fields" in blocks[3]
    assert blocks[4] == {"type": "context", "elements": [
        {"type": "mrkdwn", "text": "Or: --max-num-seqs 128: fewer sequences; --enable-chunked-prefill"}]}


def test_finding_evidence_is_truncated_inside_the_code_block() -> None:
    """Long evidence is cut inside the fences, so the code block still closes."""
    finding = {"kind": "k", "summary": "s", "evidence": ["x" * 100] * 100}
    _, blocks = finding_blocks(finding)
    code = blocks[2]["text"]["text"]
    assert len(code) <= 3000 and code.startswith("```\n") and code.endswith("…\n```")


# --- bot-token mode against the fake ------------------------------------------------------


async def test_post_then_resolve_updates_the_same_message(sinks: Sinks, slack: FakeSlack) -> None:
    """The first notification posts to #alerts; later ones update that message (by channel ID + ts) in place."""
    refs = DictRefs()
    sink = sinks.bot(slack, refs)
    reply = await sink.send(group(alert()))
    assert reply is not None and reply["channel"] == CHANNEL_ID
    assert slack.calls_to("chat.postMessage")[0].body["channel"] == "#alerts"
    ts = reply["ts"]
    assert refs.refs.get(("slack", GROUP)) == (CHANNEL_ID, ts)
    posted = slack.find(ts)
    assert posted is not None and posted.metadata == {
        "event_type": "sre_agent_alert",
        "event_payload": {"key": "n1", "group": posted.metadata["event_payload"]["group"]}}

    await sink.send(group(alert(), alert(instance="10.0.0.2:8000"), key="n2"))
    await sink.send(group(alert("resolved"), alert("resolved", instance="10.0.0.2:8000"), key="n3"))

    updates = slack.calls_to("chat.update")
    assert [(u.body["channel"], u.body["ts"]) for u in updates] == [(CHANNEL_ID, ts), (CHANNEL_ID, ts)]
    assert len(slack.messages) == 1
    message = slack.messages[0]
    assert message.edits == 2
    assert message.header() == ":white_check_mark: [RESOLVED] VLLMKVCacheSaturated"
    assert message.metadata is not None and message.metadata["event_payload"]["key"] == "n3"
    assert refs.refs.get(("slack", GROUP)) is None


async def test_refire_after_resolve_starts_a_new_message(sinks: Sinks, slack: FakeSlack) -> None:
    """Once a group resolved, its next firing is a new message, not an edit of the resolved one."""
    refs = DictRefs()
    sink = sinks.bot(slack, refs)
    await sink.send(group(alert(), key="a"))
    await sink.send(group(alert("resolved"), key="b"))
    await sink.send(group(alert(), key="c"))
    assert [m.header() for m in slack.in_channel(CHANNEL_ID)] == [
        ":white_check_mark: [RESOLVED] VLLMKVCacheSaturated", ":warning: [FIRING:1] VLLMKVCacheSaturated"]
    assert refs.refs.get(("slack", GROUP)) == (CHANNEL_ID, slack.messages[1].ts)


@pytest.mark.parametrize("error", ["message_not_found", "cant_update_message", "channel_not_found"])
async def test_update_of_a_gone_message_falls_back_to_a_new_post(sinks: Sinks, slack: FakeSlack, error: str) -> None:
    """If Slack says the stored message cannot be updated, the sink posts anew and stores the new ref."""
    refs = DictRefs()
    refs.refs[("slack", GROUP)] = (CHANNEL_ID, "1690000000.000100")
    if error != "message_not_found":  # the fake answers message_not_found for the unknown ts by itself
        slack.fail("chat.update", error=error)
    sink = sinks.bot(slack, refs)
    reply = await sink.send(group(alert(), key="x"), attempt=0)
    assert reply is not None
    assert len(slack.calls_to("chat.update")) == 1 and len(slack.calls_to("chat.postMessage")) == 1
    assert refs.refs.get(("slack", GROUP)) == (CHANNEL_ID, slack.messages[0].ts)


async def test_429_is_retried_inside_the_call_after_retry_after(sinks: Sinks, slack: FakeSlack) -> None:
    """slack-sdk's rate-limit handler waits Retry-After (through the injected sleep) and the retry succeeds."""
    slack.fail("chat.postMessage", status=429, retry_after=1)
    ft = FakeTime()
    sink = sinks.bot(slack, ft=ft)
    await sink.send(group(alert()))
    assert len(slack.calls_to("chat.postMessage")) == 2
    assert len(slack.messages) == 1
    assert ft.sleeps == [1.0]


async def test_persistent_429_becomes_retryable_error_with_retry_after(sinks: Sinks, slack: FakeSlack) -> None:
    """After the library's retries (2) a third 429 goes back to the dispatcher with retry_after_s."""
    slack.fail("chat.postMessage", status=429, retry_after=2, times=3)
    sink = sinks.bot(slack)
    with pytest.raises(DeliveryError) as info:
        await sink.send(group(alert()))
    assert not info.value.permanent and info.value.retry_after_s == 2.0
    assert "ratelimited" in str(info.value)
    assert len(slack.calls_to("chat.postMessage")) == 3


async def test_long_retry_after_is_not_waited_inside_the_call(sinks: Sinks, slack: FakeSlack) -> None:
    """A Retry-After longer than the inline cap (5 s) is handed to the dispatcher at once."""
    slack.fail("chat.postMessage", status=429, retry_after=30)
    ft = FakeTime()
    sink = sinks.bot(slack, ft=ft)
    with pytest.raises(DeliveryError) as info:
        await sink.send(group(alert()))
    assert info.value.retry_after_s == 30.0 and not info.value.permanent
    assert ft.sleeps == [] and len(slack.calls_to("chat.postMessage")) == 1


@pytest.mark.parametrize("status", [500, 502, 503])
async def test_5xx_is_a_retryable_error(sinks: Sinks, slack: FakeSlack, status: int) -> None:
    """Server errors (HTML bodies) become retryable DeliveryErrors, tried once (no inline retry)."""
    slack.fail("chat.postMessage", status=status)
    sink = sinks.bot(slack)
    with pytest.raises(DeliveryError) as info:
        await sink.send(group(alert()))
    assert not info.value.permanent
    assert f"HTTP {status}" in str(info.value)
    assert len(slack.calls_to("chat.postMessage")) == 1


async def test_invalid_auth_is_permanent_and_the_token_is_never_logged(sinks: Sinks, slack: FakeSlack) -> None:
    """A wrong token gets invalid_auth from Slack: permanent; neither the error nor the logs show the token."""
    secret = "xoxb-wrong-secret-value"
    sink = sinks.bot(slack, token=SecretStr(secret))
    with capture_logs() as logs, pytest.raises(DeliveryError) as info:
        await sink.send(group(alert()))
    assert info.value.permanent and "invalid_auth" in str(info.value)
    assert secret not in str(info.value) and secret not in repr(logs)


@pytest.mark.parametrize("error", ["not_authed", "account_inactive", "token_revoked", "invalid_blocks", "is_archived",
                                   "msg_too_long", "no_text", "channel_not_found"])
async def test_payload_and_auth_errors_are_permanent(sinks: Sinks, slack: FakeSlack, error: str) -> None:
    """Slack's ok:false codes that a retry cannot fix mark the delivery permanent."""
    slack.fail("chat.postMessage", error=error)
    sink = sinks.bot(slack)
    with pytest.raises(DeliveryError) as info:
        await sink.send(group(alert()))
    assert info.value.permanent and error in str(info.value)


async def test_unknown_channel_is_permanent(sinks: Sinks, slack: FakeSlack) -> None:
    """Posting to a channel name Slack does not know is channel_not_found, permanent."""
    sink = sinks.bot(slack, channel="#nope")
    with pytest.raises(DeliveryError) as info:
        await sink.send(group(alert()))
    assert info.value.permanent and "channel_not_found" in str(info.value)


async def test_internal_error_is_retryable(sinks: Sinks, slack: FakeSlack) -> None:
    """Slack's own transient codes (internal_error) are retried."""
    slack.fail("chat.postMessage", error="internal_error")
    sink = sinks.bot(slack)
    with pytest.raises(DeliveryError) as info:
        await sink.send(group(alert()))
    assert not info.value.permanent


async def test_timeout_is_retryable(sinks: Sinks, slack: FakeSlack) -> None:
    """A Slack that does not answer within the configured timeout gives a retryable error."""
    slack.fail("chat.postMessage", hang=True)
    sink = sinks.bot(slack, timeout="200ms")
    with pytest.raises(DeliveryError) as info:
        await sink.send(group(alert()))
    assert not info.value.permanent and "no answer within 0.2s" in str(info.value)


async def test_connection_refused_is_retryable(sinks: Sinks) -> None:
    """Nothing listening at api_url: a retryable error (the dispatcher's next attempt checks for a duplicate)."""
    config = SlackReceiverConfig(token=SecretStr("xoxb-x"), channel="#alerts",
                                 api_url=f"http://127.0.0.1:{closed_port()}/api/")
    ft = FakeTime()
    sink = sinks.add(SlackSink("slack", config, DictRefs(), clock=ft.clock, sleep=ft.sleep))
    with pytest.raises(DeliveryError) as info:
        await sink.send(group(alert()))
    assert not info.value.permanent and "ClientConnectorError" in str(info.value)


async def test_finding_goes_into_the_group_thread(sinks: Sinks, slack: FakeSlack) -> None:
    """A finding for a group with a message is a threaded reply to it; without one it stands alone."""
    refs = DictRefs()
    sink = sinks.bot(slack, refs)
    await sink.send(group(alert()))
    parent = slack.messages[0]
    await sink.send(finding_note())
    await sink.send(finding_note(key="f2", group_key="other-group"))
    [reply] = slack.replies(parent.ts)
    assert reply.channel == CHANNEL_ID and reply.header() == ":rotating_light: Finding: gpu-oom-runtime"
    assert [m.header() for m in slack.in_channel(CHANNEL_ID)] == [
        ":warning: [FIRING:1] VLLMKVCacheSaturated", ":rotating_light: Finding: gpu-oom-runtime"]
    assert slack.in_channel(CHANNEL_ID)[1].thread_ts is None


async def test_two_messages_in_one_second_wait_per_channel(sinks: Sinks, slack: FakeSlack) -> None:
    """max_messages_per_second=1: the second write to the channel waits 1 s on the injected sleep."""
    ft = FakeTime()
    refs = DictRefs()
    sink = sinks.bot(slack, refs, ft)
    await sink.send(group(alert(), key="a", group_key="g1"))
    await sink.send(group(alert(), key="b", group_key="g2"))
    assert ft.sleeps == [1.0]
    await sink.send(group(alert("resolved"), key="c", group_key="g1"))  # an update by channel ID: same channel
    assert ft.sleeps == [1.0, 1.0]


async def test_rate_is_configurable_per_channel(sinks: Sinks, slack: FakeSlack) -> None:
    """At 4 messages per second the spacing is 0.25 s; another channel is not held up."""
    ft = FakeTime()
    refs = DictRefs()
    sink = sinks.bot(slack, refs, ft, max_messages_per_second=4)
    await sink.send(group(alert(), key="a", group_key="g1"))
    await sink.send(group(alert(), key="b", group_key="g2"))
    refs.refs[("slack", "g3")] = ("C0GENERAL1", "1690000000.000100")  # a ref in #general (gone: posts anew)
    await sink.send(group(alert(), key="c", group_key="g3"))
    assert ft.sleeps == [0.25, 0.25]  # g2 waits; g3's update to #general does not; its fallback post to #alerts does


async def test_retry_adopts_the_message_an_earlier_attempt_posted(sinks: Sinks, slack: FakeSlack) -> None:
    """attempt>0 with no ref: the message found by its metadata key is updated, not posted twice."""
    ft = FakeTime()
    first = sinks.bot(slack, DictRefs(), ft)
    await first.send(group(alert(), key="dup"))  # posted, but the agent "crashes" before storing anything
    await first.close()
    refs = DictRefs()
    restarted = sinks.bot(slack, refs, ft)
    reply = await restarted.send(group(alert(), key="dup"), attempt=1)
    assert len(slack.messages) == 1 and len(slack.calls_to("chat.postMessage")) == 1
    assert reply is not None and reply["ts"] == slack.messages[0].ts
    assert refs.refs.get(("slack", GROUP)) == (CHANNEL_ID, slack.messages[0].ts)
    [history] = slack.calls_to("conversations.history")
    assert history.http_method == "GET"
    assert history.body["channel"] == CHANNEL_ID and history.body["include_all_metadata"] == "1"
    assert history.body["limit"] == "50"
    assert len(slack.calls_to("conversations.list")) == 1  # '#alerts' -> C0123ABCD


async def test_retry_without_an_earlier_post_posts_once(sinks: Sinks, slack: FakeSlack) -> None:
    """attempt>0 when nothing was posted (other messages in the channel): the check finds nothing and posts."""
    sink = sinks.bot(slack, channel=CHANNEL_ID)
    await sink.send(group(alert(), key="other", group_key="g-other"))
    await sink.send(group(alert(), key="new"), attempt=2)
    assert len(slack.calls_to("chat.postMessage")) == 2
    assert slack.calls_to("conversations.list") == []  # the configured channel is already an ID


async def test_retry_without_history_scope_still_posts(sinks: Sinks, slack: FakeSlack) -> None:
    """A bot without channels:history cannot check; it logs a warning and posts (at least once)."""
    slack.fail("conversations.history", error="missing_scope")
    sink = sinks.bot(slack)
    with capture_logs() as logs:
        await sink.send(group(alert(), key="k"), attempt=1)
    assert len(slack.messages) == 1
    assert any(e["event"].startswith("slack history not readable") for e in logs)


async def test_retry_when_history_fails_transiently_does_not_post(sinks: Sinks, slack: FakeSlack) -> None:
    """A 5xx during the duplicate check is a retryable error, not a blind post."""
    slack.fail("conversations.history", status=503)
    sink = sinks.bot(slack, channel=CHANNEL_ID)
    with pytest.raises(DeliveryError) as info:
        await sink.send(group(alert()), attempt=1)
    assert not info.value.permanent and slack.messages == []


# --- incoming-webhook mode ----------------------------------------------------------------


async def test_webhook_posts_every_notification_as_a_new_message(sinks: Sinks, slack: FakeSlack) -> None:
    """A webhook cannot update: firing, resolved and a finding are three messages with the same blocks."""
    sink = sinks.webhook(slack)
    assert await sink.send(group(alert())) is None
    await sink.send(group(alert("resolved"), key="n2"))
    await sink.send(finding_note())
    assert [m.via for m in slack.messages] == ["webhook"] * 3
    assert [m.header() for m in slack.messages] == [
        ":warning: [FIRING:1] VLLMKVCacheSaturated", ":white_check_mark: [RESOLVED] VLLMKVCacheSaturated",
        ":rotating_light: Finding: gpu-oom-runtime"]
    assert slack.messages[0].blocks == alert_blocks(group(alert()))[1]


@pytest.mark.parametrize(("status", "error"), [(400, "invalid_payload"), (400, "no_text"),
                                               (410, "channel_is_archived"), (403, "action_prohibited")])
async def test_webhook_client_errors_are_permanent(sinks: Sinks, slack: FakeSlack, status: int, error: str) -> None:
    """Webhook answers like 400 invalid_payload are permanent; the URL (a secret) is not in the message."""
    slack.fail("webhook", status=status, error=error)
    sink = sinks.webhook(slack)
    with pytest.raises(DeliveryError) as info:
        await sink.send(group(alert()))
    assert info.value.permanent and error in str(info.value)
    assert "fakewebhooksecret" not in str(info.value)


async def test_webhook_429_retried_and_5xx_retryable(sinks: Sinks, slack: FakeSlack) -> None:
    """A webhook 429 is retried after Retry-After; a 500 becomes a retryable error."""
    slack.fail("webhook", status=429, retry_after=1)
    ft = FakeTime()
    sink = sinks.webhook(slack, ft)
    await sink.send(group(alert()))
    assert len(slack.messages) == 1 and ft.sleeps == [1.0]
    slack.fail("webhook", status=500, error="rollup_error")
    with pytest.raises(DeliveryError) as info:
        await sink.send(group(alert(), key="n2"))
    assert not info.value.permanent


# --- the fake itself --------------------------------------------------------------------------


async def test_fake_requires_channel_id_for_update_and_accepts_form_bodies(slack: FakeSlack) -> None:
    """Like Slack: chat.update with a channel name is channel_not_found; form-encoded posts work; auth.test."""
    import aiohttp

    headers = {"Authorization": f"Bearer {slack.token}"}
    async with aiohttp.ClientSession(headers=headers) as http:
        async with http.post(slack.api_url + "chat.postMessage",
                             data={"channel": "#general", "text": "hi", "blocks": "[]"}) as resp:
            posted = await resp.json()
        async with http.post(slack.api_url + "chat.update",
                             json={"channel": "#general", "ts": posted["ts"], "text": "x"}) as resp:
            by_name = await resp.json()
        async with http.post(slack.api_url + "auth.test") as resp:
            auth = await resp.json()
    assert posted["ok"] and posted["channel"] == "C0GENERAL1"
    assert by_name == {"ok": False, "error": "channel_not_found"}
    assert auth["ok"] and auth["bot_id"] == "B0FAKEBOT"


FLOOD = 512 * 1024 * 1024  # what the fake would send: far more than any Slack reply


@pytest.mark.parametrize("mode, method", [("bot", "chat.postMessage"), ("bot", "conversations.history"),
                                          ("webhook", "webhook")])
async def test_a_flooding_reply_is_cut_at_the_bound_and_retried(sinks: Sinks, slack: FakeSlack, mode: str,
                                                                method: str) -> None:
    """A Slack (or proxy) reply of hundreds of MB is read only up to the sink's bound: the connection is closed
    after a few MB at most, and the send fails as a retryable DeliveryError naming the limit; the next
    attempt, answered normally, posts the message."""
    slack.fail(method, flood=FLOOD)
    sink = sinks.webhook(slack) if mode == "webhook" else sinks.bot(slack)
    with pytest.raises(DeliveryError) as info:
        await sink.send(group(alert()), attempt=1 if method == "conversations.history" else 0)
    assert not info.value.permanent and "larger than" in str(info.value)
    assert slack.flood_sent < 32 * 1024 * 1024  # the client stopped reading: the rest never left the server
    await sink.send(group(alert()), attempt=1)
    assert len(slack.in_channel("C0123ABCD")) == 1
