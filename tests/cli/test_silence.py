"""Tests for agent.cli.silence: ``sre-agent silence add|list|expire`` and ``sre-agent incidents``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agent.act.state import StateDB
from agent.cli import main
from tests.conftest import REPO

# 2023-11-14 22:13:20 UTC
T0 = 1_700_000_000_000
MIN = 60_000



def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_silence_add_prints_an_id_and_list_shows_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """add prints the new silence's UUID; list shows its matchers, times (UTC), state, author and comment."""
    db = str(tmp_path / "s.db")
    rc, out, _ = run(capsys, "silence", "add", 'alertname="VLLMKVCacheSaturated"', 'instance=~"gpu-1.*"',
                     "--duration", "2h", "--start", "2030-01-02T03:04:05Z", "--comment", "resize",
                     "--author", "alice", "--db", db)
    assert rc == 0
    sid = out.strip()
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}", sid)
    rc, out, _ = run(capsys, "silence", "list", "--db", db)
    header, row = out.splitlines()
    assert header.split() == ["ID", "MATCHERS", "STARTS", "(UTC)", "ENDS", "(UTC)", "STATE", "CREATED", "BY",
                              "COMMENT"]
    assert row.split() == [sid, 'alertname="VLLMKVCacheSaturated"', 'instance=~"gpu-1.*"', "2030-01-02",
                           "03:04:05", "2030-01-02", "05:04:05", "pending", "alice", "resize"]


def test_silence_add_defaults(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without --start the silence starts now and is active; --duration defaults to 1h; the author is set."""
    db_path = tmp_path / "s.db"
    rc, _, _ = run(capsys, "silence", "add", "job=vllm", "--db", str(db_path))
    assert rc == 0
    db = StateDB(db_path)
    [s] = db.silences.list(now_ms=0)
    db.close()
    assert s.ends_ms - s.starts_ms == 3_600_000
    assert s.matchers == ['job="vllm"']
    assert s.created_by
    rc, out, _ = run(capsys, "silence", "list", "--db", str(db_path), "--json")
    [j] = json.loads(out)
    assert (j["id"], j["status"]["state"], j["matchers"]) == (
        s.id, "active", [{"name": "job", "value": "vllm", "isRegex": False, "isEqual": True}])


@pytest.mark.parametrize(("args", "reason"), [
    (["alertname"], "bad matcher"),
    (['instance=~"("'], "not a regular expression"),
    (['instance=~"(a)\\\\1"'], "error: instance=~: not a regular expression in RE2 syntax: '(a)\\\\1'"),
    (['instance=~"(?<=a)b"'], "instance=~: not a regular expression in RE2 syntax"),
    (['instance=~".*"'], "empty string"),
    (['a="1"', "--duration", "forever"], "not a duration"),
    (['a="1"', "--start", "yesterday"], "--start"),
])
def test_silence_add_bad_input_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                                       reason: str) -> None:
    """A bad matcher (one RE2 refuses too), duration or start time exits 2 with the reason and stores nothing."""
    db = tmp_path / "s.db"
    rc, out, err = run(capsys, "silence", "add", *args, "--db", str(db))
    assert rc == 2
    assert out == ""
    assert reason in err
    if db.exists():
        d = StateDB(db)
        assert d.silences.list(now_ms=0, include_expired=True) == []
        d.close()


def test_silence_expire_reports_unknown_and_already_expired(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """expire ends a silence; an unknown or already expired ID exits 1 and names which and why."""
    db = str(tmp_path / "s.db")
    _, out, _ = run(capsys, "silence", "add", 'a="1"', "--db", db)
    sid = out.strip()
    rc, out, err = run(capsys, "silence", "expire", sid, "--db", db)
    assert (rc, out.strip(), err) == (0, f"expired {sid}", "")
    rc, out, err = run(capsys, "silence", "expire", sid, "nope", "--db", db)
    assert rc == 1
    assert err.splitlines() == [f"error: silence {sid} is already expired", "error: silence nope is unknown"]
    rc, out, _ = run(capsys, "silence", "list", "--db", db)
    assert out.splitlines()[1:] == []
    rc, out, _ = run(capsys, "silence", "list", "--all", "--db", db)
    assert " expired " in out.splitlines()[1]


def test_config_flag_uses_state_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--config FILE opens the database named by the config's state.path."""
    db = tmp_path / "from-config.db"
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(f"state:\n  path: {db}\n")
    rc, out, _ = run(capsys, "silence", "add", 'a="1"', "-c", str(cfg))
    assert rc == 0
    d = StateDB(db)
    assert [s.id for s in d.silences.list(now_ms=0)] == [out.strip()]
    d.close()


def test_missing_db_directory_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A --db in a directory that does not exist exits 2 naming the path."""
    rc, _, err = run(capsys, "silence", "list", "--db", str(tmp_path / "nope" / "s.db"))
    assert rc == 2
    assert "nope/s.db" in err


def _seed(path: Path) -> None:
    db = StateDB(path)
    labels = {"alertname": "VLLMQueueBuildup", "service": "api", "severity": "warning"}
    db.incidents.open(fingerprint="q", alertname="VLLMQueueBuildup", labels=labels, severity="warning",
                     summary="Requests are queueing", started_ms=T0)
    db.incidents.add_event("q", at_ms=T0, kind="fired", detail={"value": 12})
    db.incidents.add_event("q", at_ms=T0 + 1000, kind="notified",
                          detail={"receiver": "slack-oncall", "status": "firing", "kind": "alerts"})
    db.incidents.add_event("q", at_ms=T0 + 2000, kind="notify_failed",
                          detail={"receiver": "pager", "error": "HTTP 400"})
    db.incidents.add_event("q", at_ms=T0 + 3000, kind="action",
                          detail={"action": "scale_out", "service": "api", "from_replicas": 2, "to_replicas": 3,
                                  "reason": "VLLMQueueBuildup firing", "dry_run": False, "queued": True,
                                  "idempotency_key": "scale:api:out:2->3:1"})
    db.incidents.add_event("q", at_ms=T0 + 4000, kind="action",
                          detail={"action": "scale_out", "service": "api", "from_replicas": 3, "to_replicas": 3,
                                  "refused": True, "reason": "scale_out_cooldown: last scale-out 1s ago"})
    db.incidents.add_event("q", at_ms=T0 + 5 * MIN, kind="resolved", detail={})
    db.incidents.resolve("q", resolved_ms=T0 + 5 * MIN)
    db.incidents.open(fingerprint="g", alertname="GPUMemoryNearFull", labels={"gpu": "0"}, severity="critical",
                     summary="GPU memory nearly full", started_ms=T0 + 10 * MIN)
    db.incidents.add_event("g", at_ms=T0 + 10 * MIN + 1000, kind="action",
                          detail={"action": "scale_out", "service": "api", "from_replicas": 3, "to_replicas": 4,
                                  "dry_run": True, "reason": "GPUMemoryNearFull firing"})
    db.incidents.add_event("g", at_ms=T0 + 10 * MIN + 2000, kind="finding",
                          detail={"kind": "gpu-oom-runtime", "summary": "KV cache too large",
                                  "setting": "--max-model-len", "suggested_value": "16384", "runbook_url": ""})
    db.close()


def test_incidents_table_shows_timelines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The table lists incidents newest first, and under each its notifications, actions and findings."""
    path = tmp_path / "s.db"
    _seed(path)
    rc, out, _ = run(capsys, "incidents", "--db", str(path))
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].split() == ["ID", "ALERTNAME", "SEVERITY", "STARTED", "(UTC)", "RESOLVED", "(UTC)", "DURATION",
                                "SUMMARY"]
    assert lines[1].split()[:6] == ["2", "GPUMemoryNearFull", "critical", "2023-11-14", "22:23:20", "open"]
    assert [ln.strip() for ln in lines[2:4]] == [
        "2023-11-14 22:23:21  action  scale_out api 3→4 (dry-run)  — GPUMemoryNearFull firing",
        "2023-11-14 22:23:22  finding  gpu-oom-runtime: KV cache too large (set --max-model-len=16384)",
    ]
    assert lines[4].split() == ["1", "VLLMQueueBuildup", "warning", "2023-11-14", "22:13:20", "2023-11-14",
                                "22:18:20", "5m", "Requests", "are", "queueing"]
    assert [ln.strip() for ln in lines[5:]] == [
        "2023-11-14 22:13:20  fired  value=12",
        "2023-11-14 22:13:21  notification  slack-oncall  ok (firing)",
        "2023-11-14 22:13:22  notification  pager  failed: HTTP 400",
        "2023-11-14 22:13:23  action  scale_out api 2→3  — VLLMQueueBuildup firing",
        "2023-11-14 22:13:24  action  scale_out api 3→3 refused: scale_out_cooldown: last scale-out 1s ago",
        "2023-11-14 22:18:20  resolved",
    ]
    assert all(ln.startswith("    ") for ln in lines[2:4] + lines[5:])


def test_incidents_open_limit_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--open keeps only firing incidents, --limit caps the count, --json prints incident.to_json()."""
    path = tmp_path / "s.db"
    _seed(path)
    rc, out, _ = run(capsys, "incidents", "--open", "--json", "--db", str(path))
    [j] = json.loads(out)
    assert (rc, j["alertname"], j["status"], j["endsAt"]) == (0, "GPUMemoryNearFull", "open", None)
    assert [e["kind"] for e in j["events"]] == ["action", "finding"]
    _, out, _ = run(capsys, "incidents", "--limit", "1", "--json", "--db", str(path))
    assert [i["id"] for i in json.loads(out)] == [2]
    _, out, _ = run(capsys, "incidents", "--json", "--db", str(path))
    assert [i["id"] for i in json.loads(out)] == [2, 1]


def test_incidents_empty(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With no incidents the command says so and exits 0."""
    rc, out, _ = run(capsys, "incidents", "--db", str(tmp_path / "s.db"))
    assert (rc, out.strip()) == (0, "no incidents")


def test_help_texts_have_examples(capsys: pytest.CaptureFixture[str]) -> None:
    """Each subcommand's --help describes it and shows an example invocation."""
    for argv in (["silence"], ["silence", "add"], ["silence", "list"], ["silence", "expire"], ["incidents"]):
        with pytest.raises(SystemExit) as info:
            main([*argv, "--help"])
        out = capsys.readouterr().out
        assert info.value.code == 0
        assert "example" in out and "sre-agent " + argv[0] in out


def test_silence_round_trip_through_the_command(tmp_path: Path) -> None:
    """python -m agent: add -> list shows it active -> expire -> list --all shows it expired."""
    db = str(tmp_path / "s.db")

    def cli(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "agent", *argv, "--db", db], cwd=REPO, capture_output=True,
                              text=True, check=False, timeout=120)

    add = cli("silence", "add", 'alertname="VLLMKVCacheSaturated"', "--duration", "30m", "--comment", "e2e")
    assert add.returncode == 0, add.stderr
    sid = add.stdout.strip()
    listed = cli("silence", "list")
    assert listed.returncode == 0
    [row] = listed.stdout.splitlines()[1:]
    assert row.split()[0] == sid and "active" in row.split() and row.split()[-1] == "e2e"
    assert cli("silence", "expire", sid).returncode == 0
    assert cli("silence", "list").stdout.splitlines()[1:] == []
    [row] = cli("silence", "list", "--all").stdout.splitlines()[1:]
    assert row.split()[0] == sid and "expired" in row.split()


@pytest.mark.parametrize(("duration", "reason"), [("99999999999h", "10 years"), ("-5m", "not a duration"),
                                                  ("", "not a duration")])
def test_silence_add_absurd_durations_exit_2_without_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                               duration: str, reason: str) -> None:
    """An absurd duration exits 2 with one error line and no traceback."""
    rc, out, err = run(capsys, "silence", "add", 'a="1"', f"--duration={duration}", "--db", str(tmp_path / "s.db"))
    assert (rc, out) == (2, "")
    assert reason in err and "Traceback" not in err


FORGERS = ["\n", "\r", "\x1b[2J", "\x00", "\u2028", "\u2029", "\x85", "\u202e"]


@pytest.mark.parametrize("bad", FORGERS, ids=[ascii(b) for b in FORGERS])
def test_hostile_text_in_tables_is_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: str) -> None:
    """An alertname, summary, event detail, matcher or comment with a control character prints escaped:
    each table row and timeline line stays one line and no raw control character reaches the terminal."""
    path = tmp_path / "s.db"
    db = StateDB(path)
    db.incidents.open(fingerprint="e", alertname=f"Evil{bad}Name", labels={"a": "b"}, severity=f"warn{bad}",
                      summary=f"s{bad}1  Forged  row", started_ms=T0)
    db.incidents.add_event("e", at_ms=T0, kind="finding", detail={"kind": f"k{bad}", "summary": f"x{bad}y"})
    db.incidents.add_event("e", at_ms=T0, kind=f"odd{bad}", detail={f"key{bad}": f"v{bad}"})
    db.silences.add([f'alertname="a{bad}b"'], starts_ms=T0, ends_ms=T0 + MIN, created_by=f"me{bad}",
                    comment=f"c{bad}d")
    db.close()
    capsys.readouterr()  # the state database's own log lines (structlog's default set-up, not the CLI's)
    for argv, lines in ((["incidents"], 4), (["silence", "list", "--all"], 2)):
        rc, out, _ = run(capsys, *argv, "--db", str(path))
        assert rc == 0
        assert out.count("\n") == lines, out
        assert not any(c in out.replace("\n", "") for c in "\r\x1b\x00\u2028\u2029\x85\u202e")
        assert ascii(bad)[1:-1] in out
