"""deploy/kubernetes: every object every overlay builds is one the API server would accept as is.

Two validators, and every object goes through exactly one of them:

* built-in kinds: ``kubernetes-validate`` in strict mode (unknown fields are errors) against the
  Kubernetes versions in ``K8S_VERSIONS``; a kind or apiVersion it has no schema for, a warning
  in its CLI, fails here;
* custom resources (ServiceMonitor, PrometheusRule, ScaledObject): their CRD's published
  ``openAPIV3Schema`` (``tests/deploy/schemas/``, sources in ``SOURCES.md``) through
  :mod:`tests.deploy.crd`, which rejects what the API server would prune, and their
  ``metadata`` as ObjectMeta.

Each validator is also shown a broken object, so these tests can fail.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from tests.deploy.crd import CRD, cel_rules, load_crds, to_json_schema
from tests.deploy.kustomize import KUSTOMIZE, OVERLAYS, Doc, build, build_with_patch, needs_kubectl, one

SCHEMAS = Path(__file__).parent / "schemas"
CRD_FILES = ("monitoring.coreos.com_servicemonitors.yaml", "monitoring.coreos.com_prometheusrules.yaml",
             "keda.sh_scaledobjects.yaml")
# The oldest Kubernetes minor still under (extended) support by the big providers when this was
# written, and the newest that the pinned kubernetes-validate ships schemas for: an apiVersion
# that is removed later, or not there yet earlier, fails one of them.
K8S_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())


@functools.cache
def crds() -> dict[tuple[str, str], CRD]:
    """(apiVersion, kind) -> its CRD version, from the schema files kept as test data."""
    return {(c.api_version, c.kind): c for f in CRD_FILES for c in load_crds(SCHEMAS / f)}


def is_custom(obj: Doc) -> bool:
    """A kind whose CRD schema is kept here; everything else goes to kubernetes-validate, which
    fails on a custom kind it has no schema for, so no object escapes both validators."""
    return (obj["apiVersion"], obj["kind"]) in crds()


def builtin_errors(obj: Doc, version: str) -> list[str]:
    """Why kubernetes-validate (strict) refuses ``obj``; a missing schema counts as a refusal."""
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"{'.'.join(str(p) for p in e.path) or '<root>'}: {e.message}"]
    except kubernetes_validate.SchemaNotFoundError as e:
        return [e.message]
    return []


def custom_errors(obj: Doc, version: str = K8S_VERSIONS[0]) -> list[str]:
    """Why the API server would refuse (or prune part of) the custom resource ``obj``."""
    crd = crds().get((obj["apiVersion"], obj["kind"]))
    if crd is None:
        return [f"no CRD schema for {obj['apiVersion']} {obj['kind']} in tests/deploy/schemas"]
    # The API server validates a custom resource's metadata as ObjectMeta, like any object's:
    # a ConfigMap with the same metadata goes through kubernetes-validate's ObjectMeta schema.
    meta = builtin_errors({"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj["metadata"]}, version)
    return crd.errors(obj) + meta


def _spec_path(obj: Doc, *path: str | int) -> Any:
    node: Any = obj
    for p in path:
        node = node[p]
    return node


# -- every object of every overlay -------------------------------------------------------------

@needs_kubectl
@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_builtin_kinds_pass_kubernetes_validate_strict(overlay: str, version: str) -> None:
    """Every built-in object of the overlay validates, unknown fields and missing schemas failing."""
    docs = [d for d in build(overlay) if not is_custom(d)]
    assert docs
    errors = {f"{d['kind']}/{d['metadata']['name']}": builtin_errors(d, version) for d in docs}
    assert {k: v for k, v in errors.items() if v} == {}


@needs_kubectl
@pytest.mark.parametrize("overlay", [o for o in OVERLAYS if o in {"monitoring", "autoscaling/hpa", "autoscaling/keda"}])
def test_custom_resources_pass_their_crd_schema(overlay: str) -> None:
    """Every custom resource of the overlay validates against its published CRD schema."""
    docs = [d for d in build(overlay) if is_custom(d)]
    assert docs
    errors = {f"{d['kind']}/{d['metadata']['name']}": custom_errors(d) for d in docs}
    assert {k: v for k, v in errors.items() if v} == {}


@needs_kubectl
def test_every_crd_schema_is_used() -> None:
    """The overlays ship each kind whose CRD schema is kept here (a schema no object uses checks nothing)."""
    kinds = {(d["apiVersion"], d["kind"]) for o in OVERLAYS for d in build(o) if is_custom(d)}
    assert kinds == set(crds())


@needs_kubectl
def test_the_keda_queue_trigger_patch_validates(tmp_path: Path) -> None:
    """The optional queue trigger, once enabled, is still a valid ScaledObject."""
    docs = build_with_patch("autoscaling/keda", KUSTOMIZE / "autoscaling" / "keda" / "queue-trigger-patch.yaml",
                            tmp_path)
    assert custom_errors(one(docs, "ScaledObject")) == []


# -- the validators catch what they should -----------------------------------------------------

@needs_kubectl
@pytest.mark.parametrize(("path", "key", "value", "expected"), [
    (("spec", "template", "spec", "containers", 0), "imagePullPolicyy", "Always", "imagePullPolicyy"),
    (("spec",), "replicas", "two", "'two' is not of type 'integer'"),
    (("spec", "template", "spec", "containers", 0, "securityContext"), "runAsNonRoot", "yes", "'yes'"),
    (("spec", "template", "spec", "containers", 0, "resources", "limits"), "memory", ["1Gi"], "['1Gi']"),
], ids=["typo", "type", "bool", "quantity"])
def test_kubernetes_validate_refuses_a_broken_deployment(path: tuple[str | int, ...], key: str, value: Any,
                                                         expected: str) -> None:
    """A misspelt field, a wrong type: each is an error in strict mode."""
    dep = one(build("base"), "Deployment")
    _spec_path(dep, *path)[key] = value
    errors = builtin_errors(dep, K8S_VERSIONS[0])
    assert errors and expected in errors[0]


@pytest.mark.parametrize(("api_version", "kind"), [("autoscaling/v2beta2", "HorizontalPodAutoscaler"),
                                                   ("example.com/v1", "Widget")])
def test_a_kind_without_a_schema_fails(api_version: str, kind: str) -> None:
    """A removed apiVersion (v2beta2 went in 1.26) or an unknown kind is a failure, not a warning."""
    obj = {"apiVersion": api_version, "kind": kind, "metadata": {"name": "x"}}
    errors = builtin_errors(obj, K8S_VERSIONS[0])
    assert errors and "Couldn't find schema" in errors[0]


def _first_endpoint(o: Doc) -> Doc:
    return o["spec"]["endpoints"][0]  # type: ignore[no-any-return]


def _first_rule(o: Doc) -> Doc:
    return o["spec"]["groups"][0]["rules"][1]  # type: ignore[no-any-return]  # [0] is the Watchdog


def _trigger(o: Doc) -> Doc:
    return o["spec"]["triggers"][0]  # type: ignore[no-any-return]


def _scale_down(o: Doc) -> Doc:
    return o["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]  # type: ignore[no-any-return]


BROKEN = [
    # (overlay, kind, name, mutate, expected error text or None for "passes")
    ("monitoring", "ServiceMonitor", "sre-agent", lambda o: _first_endpoint(o).update(intervall="30s"),
     "'intervall' was unexpected"),
    ("monitoring", "ServiceMonitor", "sre-agent", lambda o: o["spec"].update(endpoint=[]), "'endpoint' was unexpected"),
    ("monitoring", "ServiceMonitor", "sre-agent", lambda o: _first_endpoint(o).update(targetPort=9400), None),
    ("monitoring", "ServiceMonitor", "sre-agent", lambda o: _first_endpoint(o).update(targetPort="http"), None),
    ("monitoring", "ServiceMonitor", "sre-agent", lambda o: _first_endpoint(o).update(targetPort=[9400]),
     "is not valid under any of the given schemas"),
    ("monitoring", "ServiceMonitor", "sre-agent",
     lambda o: _first_endpoint(o)["metricRelabelings"][0].update(action="rename"), "'rename' is not one of"),
    ("monitoring", "ServiceMonitor", "sre-agent", lambda o: _first_endpoint(o).update(interval="30 seconds"),
     "does not match"),
    ("monitoring", "PrometheusRule", None, lambda o: _first_rule(o).update(exprr="up == 0"), "'exprr' was unexpected"),
    ("monitoring", "PrometheusRule", None, lambda o: _first_rule(o).update(expr=1), None),
    ("monitoring", "PrometheusRule", None, lambda o: _first_rule(o).update(expr=["up == 0"]),
     "is not valid under any of the given schemas"),
    ("monitoring", "PrometheusRule", None, lambda o: _first_rule(o).update({"for": "10 minutes"}), "does not match"),
    ("monitoring", "PrometheusRule", None, lambda o: o["spec"]["groups"].append(dict(o["spec"]["groups"][0])),
     "duplicate entry for keys"),
    ("monitoring", "PrometheusRule", None, lambda o: o["metadata"].update(nmae="x"), "'nmae' was unexpected"),
    ("monitoring", "PrometheusRule", None, lambda o: o["metadata"]["labels"].update(severity=1),
     "1 is not of type 'string'"),
    ("autoscaling/keda", "ScaledObject", None, lambda o: o["spec"].update(minReplicaCount="2"),
     "'2' is not of type 'integer'"),
    ("autoscaling/keda", "ScaledObject", None, lambda o: _trigger(o).update(metdata={}), "'metdata' was unexpected"),
    ("autoscaling/keda", "ScaledObject", None, lambda o: o["spec"].update(triggers=[]), "should be non-empty"),
    ("autoscaling/keda", "ScaledObject", None, lambda o: _trigger(o)["metadata"].update(threshold=1),
     "1 is not of type 'string'"),
    ("autoscaling/keda", "ScaledObject", None, lambda o: _scale_down(o).update(tolerance="0.05"), None),
    ("autoscaling/keda", "ScaledObject", None, lambda o: _scale_down(o).update(tolerance="five percent"),
     "does not match"),
    ("autoscaling/keda", "ScaledObject", None, lambda o: o["spec"]["scaleTargetRef"].pop("name"),
     "'name' is a required property"),
]


@needs_kubectl
@pytest.mark.parametrize(("overlay", "kind", "name", "mutate", "expected"), BROKEN,
                         ids=[f"{b[1]}-{i}" for i, b in enumerate(BROKEN)])
def test_crd_validation_catches_broken_objects(overlay: str, kind: str, name: str | None, mutate: Any,
                                               expected: str | None) -> None:
    """Typos, wrong types, patterns, enums, int-or-string, list-map keys and metadata, each as the
    API server would judge them (None: the change is valid and must pass)."""
    obj = one(build(overlay), kind, name)
    mutate(obj)
    errors = custom_errors(obj)
    if expected is None:
        assert errors == []
    else:
        assert any(expected in e for e in errors), errors


def test_preserve_unknown_fields_and_nullable() -> None:
    """x-kubernetes-preserve-unknown-fields keeps an object open; everywhere else unknown fields fail."""
    schema = {"type": "object", "properties": {
        "apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"},
        "open": {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                 "properties": {"a": {"type": "string"}}},
        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        "closed": {"type": "object", "properties": {"a": {"type": "string", "nullable": True}}},
        "map": {"type": "object", "additionalProperties": {"type": "object", "properties": {"v": {"type": "integer"}}}},
    }}
    crd = CRD("example.com", "v1", "Widget", schema)
    base = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    assert crd.errors({**base, "open": {"a": "x", "b": 1}, "free": {"anything": [1]}, "closed": {"a": None},
                       "map": {"k": {"v": 1}}}) == []
    assert crd.errors({**base, "open": {"a": 1}})  # declared fields keep their type
    assert crd.errors({**base, "closed": {"b": 1}})
    assert crd.errors({**base, "map": {"k": {"v": 1, "w": 2}}})
    assert crd.errors({**base, "extra": 1})
    assert to_json_schema(schema)["properties"]["free"].get("additionalProperties") is None


def test_cel_rules_are_listed_and_checked_by_hand() -> None:
    """The CRDs' CEL rules are not evaluated by jsonschema: the only one (ScaledObject's
    min <= max) is checked on our objects in test_kubernetes.py; a new rule fails here."""
    found = {(c.kind, path, rule) for c in crds().values() for path, rule in cel_rules(c.schema)}
    assert {(k, p) for k, p, _ in found} == {("ScaledObject", "spec")}
    assert all("self.minReplicaCount <= " in r for _, _, r in found)


def test_schema_files_name_their_source() -> None:
    """Each CRD file kept as test data is listed in SOURCES.md with the version it came from."""
    sources = (SCHEMAS / "SOURCES.md").read_text()
    for name in CRD_FILES:
        assert f"`{name}`" in sources
    assert {f.name for f in SCHEMAS.glob("*.yaml")} == set(CRD_FILES)
    pr = load_crds(SCHEMAS / "monitoring.coreos.com_prometheusrules.yaml")
    assert [c.api_version for c in pr] == ["monitoring.coreos.com/v1"]
    assert "0.93.0" in sources and "v2.20.1" in sources
