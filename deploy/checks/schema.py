"""Kubernetes objects against the API schema: kubernetes-validate (PyPI; the Kubernetes
OpenAPI schemas it bundles, strict: an unknown field is an error), for the oldest and the newest
Kubernetes release it knows. The Prometheus Operator's ServiceMonitor and PrometheusRule, which
it has no schema for, against JSON Schemas of the fields of their CRDs that Tandem's use."""

# The chart's kubeVersion is >=1.24; 1.25 is the oldest release kubernetes-validate 1.37 bundles.
KUBE_VERSIONS = ("1.25", "1.37")

DURATION = {"type": "string", "pattern": r"^(0|(([0-9]+)(ms|s|m|h|d|w|y))+)$"}
STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
# metadata of the custom resources: ObjectMeta's usual fields.
OBJECT_META = {
    "type": "object", "additionalProperties": False, "required": ["name"],
    "properties": {"name": {"type": "string"}, "namespace": {"type": "string"},
                   "labels": STRING_MAP, "annotations": STRING_MAP},
}
LABEL_SELECTOR = {
    "type": "object", "additionalProperties": False,
    "properties": {
        "matchLabels": STRING_MAP,
        "matchExpressions": {"type": "array", "items": {
            "type": "object", "additionalProperties": False, "required": ["key", "operator"],
            "properties": {"key": {"type": "string"},
                           "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                           "values": {"type": "array", "items": {"type": "string"}}}}},
    },
}


def custom_resource(kind, spec):
    return {
        "type": "object", "additionalProperties": False,
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {"apiVersion": {"const": "monitoring.coreos.com/v1"},
                       "kind": {"const": kind}, "metadata": OBJECT_META, "spec": spec},
    }


# monitoring.coreos.com/v1 ServiceMonitor (spec.endpoints[] abbreviated to its common fields).
SERVICE_MONITOR = custom_resource("ServiceMonitor", {
    "type": "object", "additionalProperties": False, "required": ["selector", "endpoints"],
    "properties": {
        "selector": LABEL_SELECTOR,
        "namespaceSelector": {"type": "object", "additionalProperties": False, "properties": {
            "any": {"type": "boolean"},
            "matchNames": {"type": "array", "items": {"type": "string"}}}},
        "jobLabel": {"type": "string"},
        "targetLabels": {"type": "array", "items": {"type": "string"}},
        "podTargetLabels": {"type": "array", "items": {"type": "string"}},
        "sampleLimit": {"type": "integer"},
        "endpoints": {"type": "array", "items": {
            "type": "object", "additionalProperties": False,
            "properties": {
                "port": {"type": "string"}, "targetPort": {"type": ["string", "integer"]},
                "path": {"type": "string"}, "scheme": {"enum": ["http", "https"]},
                "interval": DURATION, "scrapeTimeout": DURATION,
                "honorLabels": {"type": "boolean"}, "honorTimestamps": {"type": "boolean"},
                "params": {"type": "object", "additionalProperties": {
                    "type": "array", "items": {"type": "string"}}},
                "relabelings": {"type": "array", "items": {"type": "object"}},
                "metricRelabelings": {"type": "array", "items": {"type": "object"}},
            }}},
    },
})

# monitoring.coreos.com/v1 PrometheusRule: groups as in a Prometheus rule file, plus the
# operator's own group fields.
PROMETHEUS_RULE = custom_resource("PrometheusRule", {
    "type": "object", "additionalProperties": False,
    "properties": {"groups": {"type": "array", "items": {
        "type": "object", "additionalProperties": False, "required": ["name"],
        "properties": {
            "name": {"type": "string"}, "interval": DURATION, "query_offset": DURATION,
            "limit": {"type": "integer"}, "partial_response_strategy": {"type": "string"},
            "labels": STRING_MAP,
            "rules": {"type": "array", "items": {
                "type": "object", "additionalProperties": False, "required": ["expr"],
                "properties": {
                    "record": {"type": "string"}, "alert": {"type": "string"},
                    "expr": {"type": ["string", "integer"]}, "for": DURATION,
                    "keep_firing_for": DURATION, "labels": STRING_MAP,
                    "annotations": STRING_MAP,
                }}},
        }}}},
})
CUSTOM = {"ServiceMonitor": SERVICE_MONITOR, "PrometheusRule": PROMETHEUS_RULE}


def check_custom(obj, where, problems):
    import jsonschema
    validator = jsonschema.Draft202012Validator(CUSTOM[obj["kind"]])
    for e in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.path))):
        problems.add(f"{where}.{'.'.join(map(str, e.path))}".rstrip("."), e.message)


def check_schema(obj, where, problems):
    """`obj` against the API schema of each of KUBE_VERSIONS (kubernetes-validate, strict), or
    a Prometheus Operator object against CUSTOM."""
    import kubernetes_validate
    api, kind = obj.get("apiVersion", ""), obj.get("kind", "")
    if api.startswith("monitoring.coreos.com/"):
        if api != "monitoring.coreos.com/v1" or kind not in CUSTOM:
            problems.add(where, f"{api} {kind}: only monitoring.coreos.com/v1 ServiceMonitor and "
                                f"PrometheusRule are known here")
            return
        check_custom(obj, where, problems)
        return
    seen = set()
    for version in KUBE_VERSIONS:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            msg = f"{'.'.join(map(str, e.path)) or '(object)'}: {e.message}"
            if msg not in seen:
                seen.add(msg)
                problems.add(where, f"{msg} (kubernetes-validate, Kubernetes {e.version})")
        except (kubernetes_validate.SchemaNotFoundError,
                kubernetes_validate.InvalidSchemaError) as e:
            problems.add(where, f"kubernetes-validate: {e.message}")
