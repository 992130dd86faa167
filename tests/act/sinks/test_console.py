"""Console sink: the readable lines for firing, resolved, finding and scale notifications."""

from __future__ import annotations

import io
from typing import Any

import pytest

from agent.act.notification import AlertSnapshot, Notification
from agent.act.sinks.console import ConsoleSink
from agent.errors import DeliveryError

T0_MS = 1_795_977_602_123  # 2026-11-29T18:40:02.123Z (date -u -d @1795977602)


def _alert(instance: str, status: str = "firing", value: float = 0.97) -> AlertSnapshot:
    return AlertSnapshot(
        labels={"alertname": "VLLMKVCacheSaturated", "severity": "warning", "instance": instance,
                "model_name": "llama"},
        annotations={"summary": "KV cache is nearly full.", "description": f"{instance} at {value}"},
        status=status, starts_at_ms=T0_MS - 60_000, value=value,  # type: ignore[arg-type]
    )


def _note(kind: str = "alerts", *, status: str = "firing", alerts: tuple[AlertSnapshot, ...] = (),
          finding: dict[str, Any] | None = None, scale: dict[str, Any] | None = None) -> Notification:
    return Notification(key="k", receiver="console", kind=kind, created_ms=T0_MS,  # type: ignore[arg-type]
                        group_key="g", group_labels={"alertname": "VLLMKVCacheSaturated"},
                        status=status, alerts=alerts, finding=finding, scale=scale)  # type: ignore[arg-type]


async def _printed(note: Notification) -> list[str]:
    out = io.StringIO()
    await ConsoleSink("console", out).send(note)
    return out.getvalue().splitlines()


async def test_firing_group() -> None:
    """A firing group prints a [FIRING:n] header and one indented line per alert with its labels and value."""
    lines = await _printed(_note(alerts=(_alert("gpu-a:8000"), _alert("gpu-b:8000", value=0.955))))
    assert lines == [
        "2026-11-29 18:40:02Z [FIRING:2] VLLMKVCacheSaturated (severity=warning) — KV cache is nearly full.",
        '    instance="gpu-a:8000" model_name="llama" value=0.97',
        '    instance="gpu-b:8000" model_name="llama" value=0.955',
    ]


async def test_mixed_group_counts_only_firing() -> None:
    """In a group still firing, the count is of firing alerts and a resolved one is marked."""
    lines = await _printed(_note(alerts=(_alert("a"), _alert("b", "resolved", value=0.5))))
    assert lines == [
        "2026-11-29 18:40:02Z [FIRING:1] VLLMKVCacheSaturated (severity=warning) — KV cache is nearly full.",
        '    instance="a" model_name="llama" value=0.97',
        '    instance="b" model_name="llama" value=0.5 (resolved)',
    ]


async def test_resolved_group() -> None:
    """A resolved group prints [RESOLVED]."""
    lines = await _printed(_note(status="resolved", alerts=(_alert("a", "resolved"),)))
    assert lines == [
        "2026-11-29 18:40:02Z [RESOLVED] VLLMKVCacheSaturated (severity=warning) — KV cache is nearly full.",
        '    instance="a" model_name="llama" value=0.97',
    ]


async def test_label_value_with_newline_stays_on_its_line() -> None:
    """Quotes and newlines in label values are escaped, so one alert is one line."""
    a = AlertSnapshot(labels={"alertname": "X", "msg": 'say "hi"\nbye'}, annotations={}, status="firing",
                      starts_at_ms=T0_MS, value=1.0)
    lines = await _printed(_note(alerts=(a,)))
    assert lines == ["2026-11-29 18:40:02Z [FIRING:1] X", '    msg="say \\"hi\\"\\nbye" value=1']


async def test_finding() -> None:
    """A finding prints kind, summary, the setting to change and the runbook."""
    finding = {"kind": "gpu-oom-runtime", "summary": "CUDA out of memory during a forward pass",
               "setting": "--gpu-memory-utilization", "suggested_value": "0.85",
               "runbook_url": "https://example.org/runbooks/diagnosis-gpu-oom-runtime.md"}
    assert await _printed(_note("finding", finding=finding)) == [
        "2026-11-29 18:40:02Z [FINDING] gpu-oom-runtime: CUDA out of memory during a forward pass"
        " → set --gpu-memory-utilization to 0.85 (https://example.org/runbooks/diagnosis-gpu-oom-runtime.md)"
    ]


async def test_finding_without_setting() -> None:
    """A finding with no setting or runbook prints just kind and summary."""
    finding = {"kind": "nccl-bandwidth-ok", "summary": "all-reduce bus bandwidth 182 GB/s"}
    assert await _printed(_note("finding", finding=finding)) == [
        "2026-11-29 18:40:02Z [FINDING] nccl-bandwidth-ok: all-reduce bus bandwidth 182 GB/s"
    ]


async def test_scale() -> None:
    """A scale request prints service, direction, replica change and reason."""
    scale = {"service": "vllm-llama", "direction": "out", "from_replicas": 2, "to_replicas": 3, "replicas": 3,
             "reason": "VLLMQueueGrowing", "dry_run": False}
    assert await _printed(_note("scale", scale=scale)) == [
        "2026-11-29 18:40:02Z [SCALE] vllm-llama out 2 → 3 (VLLMQueueGrowing)"
    ]


async def test_scale_dry_run() -> None:
    """A dry-run scale request says so."""
    scale = {"service": "vllm-llama", "direction": "in", "from_replicas": 4, "to_replicas": 3,
             "reason": "healthy for 15m", "dry_run": True}
    assert await _printed(_note("scale", scale=scale)) == [
        "2026-11-29 18:40:02Z [SCALE] vllm-llama in 4 → 3 (healthy for 15m) [dry run]"
    ]


async def test_flushes_after_each_notification() -> None:
    """Every notification is flushed at once (log shippers and | tee see it immediately)."""
    class Counting(io.StringIO):
        flushes = 0

        def flush(self) -> None:
            self.flushes += 1
            super().flush()

    out = Counting()
    sink = ConsoleSink("console", out)
    await sink.send(_note(alerts=(_alert("a"),)))
    await sink.send(_note(alerts=(_alert("b"),)))
    assert out.flushes == 2


async def test_closed_stream_raises_delivery_error() -> None:
    """Writing to a closed stream raises DeliveryError (nothing else does)."""
    out = io.StringIO()
    out.close()
    with pytest.raises(DeliveryError):
        await ConsoleSink("console", out).send(_note(alerts=(_alert("a"),)))


async def test_defaults_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    """Without a stream, lines go to stdout."""
    await ConsoleSink("console").send(_note(status="resolved", alerts=(_alert("a", "resolved"),)))
    assert "[RESOLVED] VLLMKVCacheSaturated" in capsys.readouterr().out


HOSTILE = ["\n", "\r", "\x1b[2J\x1b[31m", "\x00", "\u2028", "\u2029", "\x85", "\u202e"]


@pytest.mark.parametrize("bad", HOSTILE, ids=[ascii(b) for b in HOSTILE])
async def test_hostile_text_anywhere_cannot_forge_or_colour_a_line(bad: str) -> None:
    """Control characters in an alertname, summary, label, finding or scale field are printed escaped:
    each notification prints exactly its own lines and no raw control character reaches the stream."""
    alert = AlertSnapshot(labels={"alertname": f"Evil{bad}Name", "severity": f"warn{bad}", "instance": f"a{bad}b",
                                  f"weird{bad}label": "x"},
                          annotations={"summary": f"forged{bad}2026-01-01 00:00:00Z [RESOLVED] Everything"},
                          status="firing", starts_at_ms=T0_MS)
    finding = {"kind": f"k{bad}", "summary": f"s{bad}", "setting": f"--x{bad}", "suggested_value": f"1{bad}",
               "runbook_url": f"https://r{bad}"}
    scale = {"service": f"svc{bad}", "direction": f"out{bad}", "reason": f"because{bad}"}
    notes = [_note(alerts=(alert,)), _note("finding", finding=finding), _note("scale", scale=scale)]
    out = io.StringIO()
    sink = ConsoleSink("console", out)
    for note in notes:
        await sink.send(note)
    text = out.getvalue()
    assert text.count("\n") == 4  # header + one alert line, one finding line, one scale line
    assert not any(c in text.replace("\n", "") for c in "\r\x1b\x00\u2028\u2029\x85\u202e")
    assert "Evil" + ascii(bad)[1:-1] + "Name" in text
