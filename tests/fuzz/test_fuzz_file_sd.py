"""Fuzz file_sd: whatever bytes a file_sd file holds, JSON or YAML, one refresh of the discovery loop
gives that file's targets or a counted refusal naming it, never an exception, and a good file read
beside it keeps its targets."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import yaml
from hypothesis import given
from hypothesis import strategies as st

from agent.collect.discovery import FileSD, TargetSpec
from agent.config import FileSDConfig
from tests.fuzz import budget

_LABEL_NAMES = st.one_of(st.sampled_from(["job", "model", "__scheme__", "__metrics_path__", "__x", "instance",
                                          "a-b", "1a", "", "a\n"]),
                         st.integers(-3, 3), st.booleans(), st.none(), st.text(max_size=6))
_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(),
                     st.sampled_from(["h:1", "10.0.0.1:8000", "[::1]:9", "h:99999", "h", "http://h:1/m", "u:p@h:1",
                                      "https", "ftp", "/m", "h 1:2", "\ud800", "on", "yes"]),
                     st.text(max_size=10))
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                         st.dictionaries(_LABEL_NAMES, inner, max_size=3)),
                       max_leaves=12)
_GROUP = st.fixed_dictionaries({}, optional={
    "targets": st.one_of(st.lists(_SCALARS, max_size=4), _VALUES),
    "labels": st.one_of(st.dictionaries(_LABEL_NAMES, _SCALARS, max_size=4), _VALUES),
    "x": _VALUES,
})
_GOOD_ADDRESS = st.sampled_from(["h:1", "10.0.0.1:8000", "[::1]:9", "vllm-0.ns:8000"])
_GOOD_VALUE = st.sampled_from(["a", "https", "/m", "llama-3", ""])
#: Valid groups, so examples also reach the paths that build targets (the other strategies find the refusals).
_NEAR_GROUP = st.fixed_dictionaries({"targets": st.lists(_GOOD_ADDRESS, min_size=1, max_size=4)}, optional={
    "labels": st.dictionaries(st.sampled_from(["model", "job", "__scheme__", "__metrics_path__", "zone", "__x"]),
                              _GOOD_VALUE, max_size=3),
})
_DOCUMENT = st.one_of(st.lists(_GROUP, max_size=3), _VALUES)


def _yaml(doc: object) -> bytes:
    try:
        return yaml.safe_dump(doc, allow_unicode=True).encode("utf-8", "surrogatepass")
    except (yaml.YAMLError, ValueError):
        return b"[]"


_FILES = st.one_of(
    st.tuples(st.sampled_from([".json", ".yaml"]), st.lists(_NEAR_GROUP, min_size=1, max_size=3).map(
        lambda d: json.dumps(d, ensure_ascii=False).encode("utf-8", "surrogatepass"))),  # JSON is YAML too
    st.tuples(st.just(".json"), _DOCUMENT.map(lambda d: json.dumps(d).encode())),
    st.tuples(st.just(".yaml"), _DOCUMENT.map(_yaml)),
    st.tuples(st.sampled_from([".json", ".yaml"]),
              st.text(st.sampled_from(list("-targets:lbh1&*!{}[],'\"#\n |>?%@`\t0123456789.\\u")), max_size=120)
              .map(str.encode)),
    st.tuples(st.sampled_from([".json", ".yaml"]), st.binary(max_size=80)),
)


@budget(80)
@given(_FILES)
def test_any_file_gives_targets_or_a_counted_refusal(case: tuple[str, bytes]) -> None:
    """One refresh with any file beside a good one: no exception, the good target stays, and the file
    either adds only well-formed targets or is refused, counted and named in errors()."""
    suffix, content = case
    with tempfile.TemporaryDirectory() as tmp:
        good, fuzzed = Path(tmp) / "good.json", Path(tmp) / f"fuzzed{suffix}"
        good.write_text('[{"targets": ["good:1"]}]')
        fuzzed.write_bytes(content)
        os.utime(fuzzed, (1e9, 1e9))
        sd = FileSD([FileSDConfig(files=[str(good), str(fuzzed)])], clock=lambda: 0.0)
        specs = sd.refresh()
    assert all(isinstance(s, TargetSpec) for s in specs)
    assert [s.instance for s in specs if s.source == f"file_sd:{good}"] == ["good:1"]
    errors = sd.errors()
    if sd.read_errors:
        assert sd.read_errors == 1 and list(errors) == [str(fuzzed)] and len(errors[str(fuzzed)]) < 2000
        assert not [s for s in specs if s.source == f"file_sd:{fuzzed}"]
    else:
        assert errors == {}
        for s in specs:
            labels = dict(s.labels)
            assert s.url.startswith(("http://", "https://")) and labels["instance"] and labels["job"]
            assert all(isinstance(v, str) and v.encode() for v in labels.values())
