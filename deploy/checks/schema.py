"""Kubernetes objects against the API schema: the model classes of the python3-kubernetes
client, walked strictly, plus the fields and CRDs the client does not know."""

# API fields newer than python3-kubernetes 22.6 (Kubernetes 1.22), as {model: {json name: type}},
# and the models they need. Only what the manifests use; each line names its source.
NEWER_FIELDS = {
    # Probe.grpc: GRPCAction, alpha in 1.23, beta (on by default) in 1.24, GA in 1.27.
    "V1Probe": {"grpc": "V1GRPCAction"},
}
NEWER_MODELS = {
    "V1GRPCAction": {"fields": {"port": "int", "service": "str"}, "required": ["port"]},
}


def custom_resource(spec):
    """The schema of a custom resource whose spec is `spec` ({"fields": ..., "required": ...})."""
    return {
        "fields": {"apiVersion": "str", "kind": "str", "metadata": "V1ObjectMeta", "spec": spec},
        "required": ["apiVersion", "kind", "metadata", "spec"],
    }


# monitoring.coreos.com/v1 ServiceMonitor: the fields of the Prometheus Operator's CRD that a
# ServiceMonitor like ours can use (spec.endpoints[] abbreviated to its common fields).
SERVICE_MONITOR = custom_resource({
    "fields": {
        "selector": "V1LabelSelector",
        "namespaceSelector": {"fields": {"any": "bool", "matchNames": "list[str]"}},
        "jobLabel": "str",
        "targetLabels": "list[str]",
        "podTargetLabels": "list[str]",
        "sampleLimit": "int",
        "endpoints": [{
            "fields": {
                "port": "str", "targetPort": "object", "path": "str", "scheme": "str",
                "interval": "str", "scrapeTimeout": "str", "honorLabels": "bool",
                "honorTimestamps": "bool", "params": "dict(str, list[str])",
                "relabelings": "list[object]", "metricRelabelings": "list[object]",
            },
        }],
    },
    "required": ["selector", "endpoints"],
})


# monitoring.coreos.com/v1 PrometheusRule: the fields of the Prometheus Operator's CRD (groups
# as in a Prometheus rule file, plus the operator's own group fields).
PROMETHEUS_RULE_SCHEMA = custom_resource({
    "fields": {
        "groups": [{
            "fields": {
                "name": "str", "interval": "str", "query_offset": "str", "limit": "int",
                "partial_response_strategy": "str", "labels": "dict(str, str)",
                "rules": [{
                    "fields": {
                        "record": "str", "alert": "str", "expr": "str", "for": "str",
                        "keep_firing_for": "str", "labels": "dict(str, str)",
                        "annotations": "dict(str, str)",
                    },
                    "required": ["expr"],
                }],
            },
            "required": ["name"],
        }],
    },
})


def model_class(name):
    import kubernetes.client as kc
    return getattr(kc, name, None)


def check_value(value, schema, path, problems):
    """Checks `value` against `schema`: a client type name ("str", "list[V1Container]",
    "V1PodSpec", ...) or an inline object schema ({"fields": ..., "required": ...} or [that])."""
    if isinstance(schema, list):
        if not isinstance(value, list):
            problems.add(path, f"expected a list, got {type(value).__name__}")
            return
        for i, v in enumerate(value):
            check_value(v, schema[0], f"{path}[{i}]", problems)
        return
    if isinstance(schema, dict):
        check_object(value, schema["fields"], schema.get("required", []), path, problems)
        return
    t = schema
    if t.startswith("list["):
        if not isinstance(value, list):
            problems.add(path, f"expected a list, got {type(value).__name__}")
            return
        for i, v in enumerate(value):
            check_value(v, t[5:-1], f"{path}[{i}]", problems)
    elif t.startswith("dict("):
        inner = t[t.index(",") + 1:-1].strip()
        if not isinstance(value, dict):
            problems.add(path, f"expected a map, got {type(value).__name__}")
            return
        for k, v in value.items():
            if not isinstance(k, str):
                problems.add(path, f"map key {k!r} is not a string")
            check_value(v, inner, f"{path}.{k}", problems)
    elif t == "str":
        if not isinstance(value, str):
            problems.add(path, f"expected a string, got {value!r}")
    elif t == "int":
        if not isinstance(value, int) or isinstance(value, bool):
            problems.add(path, f"expected an integer, got {value!r}")
    elif t == "float":
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            problems.add(path, f"expected a number, got {value!r}")
    elif t == "bool":
        if not isinstance(value, bool):
            problems.add(path, f"expected true or false, got {value!r}")
    elif t == "datetime" or t == "date":
        if not isinstance(value, str):
            problems.add(path, f"expected a timestamp string, got {value!r}")
    elif t == "object":
        pass  # IntOrString, RawExtension: any JSON value
    elif t in NEWER_MODELS:
        m = NEWER_MODELS[t]
        check_object(value, m["fields"], m.get("required", []), path, problems)
    else:
        cls = model_class(t)
        if cls is None:
            problems.add(path, f"unknown model {t} (python3-kubernetes too old?)")
            return
        fields = {json_name: cls.openapi_types[attr]
                  for attr, json_name in cls.attribute_map.items()}
        fields.update(NEWER_FIELDS.get(t, {}))
        check_object(value, fields, required_fields(cls), path, problems, t)


def required_fields(cls):
    """JSON names of the fields the client's model refuses to leave unset."""
    import kubernetes.client as kc
    required = []
    config = kc.Configuration()
    config.client_side_validation = True
    for attr, json_name in cls.attribute_map.items():
        obj = cls.__new__(cls)
        obj.local_vars_configuration = config
        try:
            setattr(obj, attr, None)
        except ValueError:
            required.append(json_name)
    return required


def check_object(value, fields, required, path, problems, type_name="object"):
    if not isinstance(value, dict):
        problems.add(path, f"expected an object ({type_name}), got {value!r}")
        return
    for k, v in value.items():
        if k not in fields:
            problems.add(f"{path}.{k}", f"unknown field (not in {type_name})")
            continue
        if v is None:
            continue
        check_value(v, fields[k], f"{path}.{k}", problems)
    for r in required:
        if value.get(r) is None:
            problems.add(path, f"required field {r} is missing ({type_name})")


def check_schema(obj, where, problems):
    api, kind = obj.get("apiVersion", ""), obj.get("kind", "")
    if (api, kind) == ("monitoring.coreos.com/v1", "ServiceMonitor"):
        check_value(obj, SERVICE_MONITOR, where, problems)
        return
    if (api, kind) == ("monitoring.coreos.com/v1", "PrometheusRule"):
        check_value(obj, PROMETHEUS_RULE_SCHEMA, where, problems)
        return
    if api.startswith("monitoring.coreos.com/"):
        problems.add(where, f"{api} {kind}: only monitoring.coreos.com/v1 ServiceMonitor and "
                            f"PrometheusRule are known here")
        return
    version = api.split("/")[-1]
    if (api, kind) == ("autoscaling/v2", "HorizontalPodAutoscaler"):
        # autoscaling/v2 (GA in Kubernetes 1.23) is v2beta2's schema under a new version; the
        # installed client predates it.
        version = "v2beta2"
    name = version[:1].upper() + version[1:] + kind
    if model_class(name) is None:
        problems.add(where, f"no Kubernetes model for {api} {kind}")
        return
    check_value(obj, name, where, problems)
