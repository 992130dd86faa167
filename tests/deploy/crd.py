"""Validates custom resources against a CustomResourceDefinition's ``openAPIV3Schema``.

The API server validates a custom resource against the structural schema of its CRD version and
then prunes (or, with ``kubectl apply --validate=strict``, rejects) every field the schema does
not declare. JSON Schema has no pruning, so :func:`to_json_schema` turns the OpenAPI v3 schema
into a JSON Schema (draft 4, whose boolean ``exclusiveMinimum`` OpenAPI v3.0 shares) that fails
on what the API server would drop or refuse:

* an object with ``properties`` and no ``additionalProperties`` gets ``additionalProperties:
  false``, so a misspelt field is an error; ``x-kubernetes-preserve-unknown-fields: true``
  keeps an object open, as it keeps the API server from pruning it;
* ``x-kubernetes-int-or-string: true`` accepts an integer or a string (and nothing else);
* ``nullable: true`` accepts null;
* ``x-kubernetes-list-type: set`` items are unique, ``map`` items are unique by their
  ``x-kubernetes-list-map-keys``;
* ``pattern`` is Go's ``regexp`` (RE2, unanchored), as in the API server: Python's ``re`` refuses
  some of the published patterns (``^(?i)(abort|warn)?$``) and reads others differently;
* ``metadata`` at the root is left to the caller: the API server validates it as ObjectMeta,
  not against the CRD (see tests/deploy/test_validate.py).

``x-kubernetes-validations`` (CEL rules) are not evaluated: :func:`cel_rules` lists them so a
test can check what they say by hand.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from agent.gocompat.regex import compile_go

Schema = dict[str, Any]


def to_json_schema(schema: Schema) -> Schema:
    """The JSON Schema equivalent of a CRD's structural ``openAPIV3Schema`` (see the module doc)."""
    out = _convert(copy.deepcopy(schema))
    out.setdefault("properties", {})["metadata"] = {"type": "object"}
    return out


def _convert(s: Schema) -> Schema:
    if s.get("x-kubernetes-int-or-string"):
        s.pop("type", None)
        s.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if s.pop("nullable", False):
        t = s.get("type")
        if isinstance(t, str):
            s["type"] = [t, "null"]
    if "properties" in s:
        s["properties"] = {k: _convert(v) for k, v in s["properties"].items()}
    if isinstance(s.get("additionalProperties"), dict):
        s["additionalProperties"] = _convert(s["additionalProperties"])
    elif ("properties" in s and "additionalProperties" not in s
          and not s.get("x-kubernetes-preserve-unknown-fields")):
        s["additionalProperties"] = False
    if isinstance(s.get("items"), dict):
        s["items"] = _convert(s["items"])
    for key in ("anyOf", "allOf", "oneOf"):
        if key in s:
            s[key] = [_convert(sub) for sub in s[key]]
    if "not" in s:
        s["not"] = _convert(s["not"])
    if s.get("x-kubernetes-list-type") == "set":
        s["uniqueItems"] = True
    return s


def _list_map_keys(validator: Any, keys: list[str], instance: Any,
                   schema: Schema) -> Iterator[jsonschema.ValidationError]:
    """``x-kubernetes-list-type: map``: no two items share their key fields."""
    if schema.get("x-kubernetes-list-type") != "map" or not isinstance(instance, list):
        return
    seen: set[tuple[Any, ...]] = set()
    for item in instance:
        if not isinstance(item, dict):
            continue
        key = tuple(repr(item.get(k)) for k in keys)
        if key in seen:
            yield jsonschema.ValidationError(f"duplicate entry for keys {dict(zip(keys, key, strict=True))}")
        seen.add(key)


def _go_pattern(validator: Any, pattern: str, instance: Any,
                schema: Schema) -> Iterator[jsonschema.ValidationError]:
    """``pattern`` as the API server applies it: Go's ``regexp.MatchString`` on strings."""
    if isinstance(instance, str) and compile_go(pattern, what="CRD pattern").search(instance) is None:
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


_Validator = jsonschema.validators.extend(  # type: ignore[no-untyped-call]  # untyped in types-jsonschema
    jsonschema.Draft4Validator, {"x-kubernetes-list-map-keys": _list_map_keys, "pattern": _go_pattern})
# The metaschema without format checks: its "regex" format would compile the patterns with Python's re.
_MetaValidator = jsonschema.Draft4Validator(jsonschema.Draft4Validator.META_SCHEMA)


@dataclass(frozen=True)
class CRD:
    """One served version of a CustomResourceDefinition."""

    group: str
    version: str
    kind: str
    schema: Schema  # the openAPIV3Schema as published

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    @functools.cached_property
    def validator(self) -> Any:
        converted = to_json_schema(self.schema)
        _MetaValidator.validate(converted)
        return _Validator(converted)

    def errors(self, obj: dict[str, Any]) -> list[str]:
        """Every reason the API server would refuse or prune part of ``obj`` ("" path = root)."""
        return [f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
                for e in sorted(self.validator.iter_errors(obj), key=lambda e: list(map(str, e.path)))]


def load_crds(path: Path) -> list[CRD]:
    """The served versions of the CustomResourceDefinition(s) in ``path``."""
    out: list[CRD] = []
    for doc in yaml.safe_load_all(path.read_text()):
        if not doc or doc.get("kind") != "CustomResourceDefinition":
            continue
        spec = doc["spec"]
        for v in spec["versions"]:
            if v.get("served", True):
                out.append(CRD(spec["group"], v["name"], spec["names"]["kind"], v["schema"]["openAPIV3Schema"]))
    return out


def cel_rules(schema: Schema, path: str = "") -> list[tuple[str, str]]:
    """``(path, rule)`` for every ``x-kubernetes-validations`` CEL rule in ``schema``."""
    found = [(path or "<root>", r["rule"]) for r in schema.get("x-kubernetes-validations", [])]
    for name, sub in schema.get("properties", {}).items():
        found += cel_rules(sub, f"{path}.{name}" if path else name)
    if isinstance(schema.get("items"), dict):
        found += cel_rules(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        found += cel_rules(schema["additionalProperties"], f"{path}.*")
    return found
