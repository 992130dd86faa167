"""remote_write: endpoints with credentials from files or env only (redacted), external labels, what to write,
queue bounds; every mistake named by its key path."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.config import Config, load_config
from agent.errors import ConfigError

URL = "http://vm:8428/api/v1/write"


def _load(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> Config:
    f = tmp_path / "agent.yaml"
    f.write_text(text)
    return load_config(f, environ=environ)


def _errors(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, text)
    return info.value.errors


def test_none_by_default_and_recording_plus_alerts_when_given(tmp_path: Path) -> None:
    """No remote write unless configured; an entry writes recording results and ALERTS(_FOR_STATE) by default,
    with Prometheus' queue defaults."""
    assert load_config(None).remote_write == []
    [rw] = _load(tmp_path, f"remote_write: [{{url: '{URL}'}}]\n").remote_write
    assert (rw.write, rw.queue_name, rw.timeout) == (["recording", "alerts"], URL, 30.0)
    assert (rw.queue.capacity, rw.queue.max_samples_per_send, rw.queue.min_backoff, rw.queue.max_backoff) == (
        500_000, 2000, 0.03, 5.0)


def test_credentials_come_from_env_or_file_and_are_redacted(tmp_path: Path) -> None:
    """bearer_token_env and basic_auth.password_file resolve; the redacted config and repr show neither."""
    pw = tmp_path / "pw"
    pw.write_text("p4ss\n")
    cfg = _load(tmp_path, f"remote_write:\n  - {{url: '{URL}', bearer_token_env: RW_TOKEN}}\n"
                          f"  - {{url: '{URL}', name: tenant-b, basic_auth: {{username: u, password_file: '{pw}'}}}}\n",
                {"RW_TOKEN": "t0ken"})
    a, b = cfg.remote_write
    assert a.bearer_token is not None and a.bearer_token.get_secret_value() == "t0ken"
    assert b.basic_auth is not None and b.basic_auth.password.get_secret_value() == "p4ss"
    shown = str(cfg.redacted()) + repr(cfg)
    assert "t0ken" not in shown and "p4ss" not in shown and "**********" in str(cfg.redacted())


@pytest.mark.parametrize(("text", "message"), [
    (f"remote_write: [{{url: '{URL}', bearer_token: hunter2}}]", "remote_write[0]: bearer_token: secrets are not"),
    ("remote_write: [{url: 'http://u:p@vm:8428/api/v1/write'}]", "remote_write[0].url"),
    (f"remote_write: [{{url: '{URL}', headers: {{Content-Encoding: gzip}}}}]", "is set by the agent"),
    (f"remote_write: [{{url: '{URL}', external_labels: {{__replica__: a}}}}]", "invalid external label name"),
    (f"remote_write: [{{url: '{URL}', external_labels: {{replica: ''}}}}]", "empty value"),
    (f"remote_write: [{{url: '{URL}', write: [alerts, alerts]}}]", "each kind once"),
    (f"remote_write: [{{url: '{URL}', write: [traces]}}]", "remote_write[0].write[0]"),
    (f"remote_write: [{{url: '{URL}', queue: {{capacity: 10, max_samples_per_send: 100}}}}]", "cannot exceed"),
    (f"remote_write: [{{url: '{URL}', queue: {{min_backoff: 10s, max_backoff: 1s}}}}]", "min_backoff <= max"),
    (f"remote_write: [{{url: '{URL}'}}, {{url: '{URL}'}}]", "remote_write[1]: a second entry"),
    (f"source: {{type: prometheus, url: 'http://p:9090'}}\nremote_write: [{{url: '{URL}', write: [scraped]}}]",
     "remote_write[0].write: 'scraped' is for embedded mode"),
])
def test_mistakes_are_named(tmp_path: Path, text: str, message: str) -> None:
    """Each mistake is refused with its key path, and an inline secret's value is never echoed."""
    errs = _errors(tmp_path, text + "\n")
    assert any(message in e for e in errs), errs
    assert not any("hunter2" in e for e in errs)
