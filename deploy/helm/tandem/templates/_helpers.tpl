{{/*
Helpers shared by the templates. deploy/validate.py renders and lints the chart with Helm itself
(its Go SDK), so any Helm and Sprig function may be used.
*/}}

{{/* Labels of every object: the kustomize base's, plus Helm's bookkeeping. */}}
{{- define "tandem.labels" -}}
app.kubernetes.io/name: tandem
app.kubernetes.io/part-of: tandem
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{- define "tandem.image" -}}
{{ printf "%s:%s" .Values.image.repository .Values.image.tag }}
{{- end }}

{{/* A change of the ConfigMap rolls the pods (kustomize puts a hash in its name instead). */}}
{{- define "tandem.configChecksum" -}}
{{ toJson (dict "model" .Values.model "flags" .Values.flags "extra" .Values.extraConfig) | sha256sum }}
{{- end }}

{{/* The Secret holding the routers' keys file: the user's, or the one the chart makes. */}}
{{- define "tandem.apiKeysSecret" -}}
{{ .Values.apiKeys.existingSecret | default "tandem-api-keys" }}
{{- end }}

{{/* A change of the generated keys file (its limits) rolls the routers, which read it once. */}}
{{- define "tandem.apiKeysChecksum" -}}
{{ toJson (dict "key" .Values.apiKeys.key "limits" .Values.apiKeys.limits) | sha256sum }}
{{- end }}

{{/* " --tls-cert ... --tls-ca ..." under TLS, else nothing. */}}
{{- define "tandem.tlsFlags" -}}
{{- if .Values.tls.enabled }} --tls-cert /etc/tandem/tls/tls.crt --tls-key /etc/tandem/tls/tls.key --tls-ca /etc/tandem/tls/ca.crt{{ end }}
{{- end }}

{{/* How a probe asks: gRPC health on 7000; under TLS, tandem-health with the role's files. */}}
{{- define "tandem.probe" -}}
{{- if .Values.tls.enabled -}}
exec:
  command: ["tandem-health", "--address", "localhost:7000", "--tls-ca", "/etc/tandem/tls/ca.crt", "--tls-cert", "/etc/tandem/tls/tls.crt", "--tls-key", "/etc/tandem/tls/tls.key"]
{{- else -}}
grpc:
  port: 7000
{{- end }}
{{- end }}

{{/* The pod spec's fields before `containers`; called with (dict "root" . "role" "router"). */}}
{{- define "tandem.podSpec" -}}
{{- $v := index .root.Values .role -}}
terminationGracePeriodSeconds: {{ .root.Values.terminationGracePeriodSeconds }}
automountServiceAccountToken: false
securityContext:
  {{- toYaml .root.Values.podSecurityContext | nindent 2 }}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The container's fields after `args`; called with (dict "root" . "role" "prefill"). */}}
{{- define "tandem.containerCommon" -}}
{{- $v := index .root.Values .role -}}
envFrom:
  - configMapRef:
      name: tandem-config
env:
  {{- with $v.env }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
  # The address registered with the routers (and, for decode, put in KV targets).
  - name: TANDEM_ADVERTISE_HOST
    valueFrom:
      fieldRef:
        fieldPath: status.podIP
  {{- if ne .role "router" }}
  - name: POD_NAME
    valueFrom:
      fieldRef:
        fieldPath: metadata.name
  {{- end }}
  {{- if and (eq .role "router") .root.Values.apiKeys.enabled }}
  - name: TANDEM_API_KEYS_FILE
    value: {{ printf "/etc/tandem/api-keys/%s" .root.Values.apiKeys.key }}
  {{- end }}
{{- end }}

{{/* Probes, resources, security context and mounts; called like containerCommon. */}}
{{- define "tandem.containerTail" -}}
{{- $v := index .root.Values .role -}}
startupProbe:
  {{- include "tandem.probe" .root | nindent 2 }}
  {{- if eq .role "router" }}
  periodSeconds: 2
  failureThreshold: 60
  {{- else }}
  # Loading a large model can take minutes: the startup probe allows 10 of them.
  periodSeconds: 5
  failureThreshold: 120
  {{- end }}
readinessProbe:
  {{- include "tandem.probe" .root | nindent 2 }}
  periodSeconds: 5
livenessProbe:
  {{- include "tandem.probe" .root | nindent 2 }}
  periodSeconds: 10
  failureThreshold: 3
resources:
  {{- toYaml $v.resources | nindent 2 }}
securityContext:
  {{- toYaml .root.Values.containerSecurityContext | nindent 2 }}
volumeMounts:
  - name: tmp
    mountPath: /tmp
  - name: cluster-secret
    mountPath: /etc/tandem/secret
    readOnly: true
  {{- if and (eq .role "router") .root.Values.apiKeys.enabled }}
  - name: api-keys
    mountPath: /etc/tandem/api-keys
    readOnly: true
  {{- end }}
  {{- if .root.Values.tls.enabled }}
  - name: tls
    mountPath: /etc/tandem/tls
    readOnly: true
  {{- end }}
  {{- if .root.Values.models.claimName }}
  - name: models
    mountPath: /models
    readOnly: true
  {{- end }}
  {{- with $v.extraVolumeMounts }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}

{{/* The pod's volumes; called like containerCommon. */}}
{{- define "tandem.volumes" -}}
{{- $v := index .root.Values .role -}}
- name: tmp
  emptyDir: {}
# The cluster's secret: every internal call and KV connection proves it; readable by the
# pod's group only.
- name: cluster-secret
  secret:
    secretName: {{ .root.Values.clusterSecret.name }}
    defaultMode: 0440
{{- if and (eq .role "router") .root.Values.apiKeys.enabled }}
- name: api-keys
  secret:
    secretName: {{ include "tandem.apiKeysSecret" .root }}
    defaultMode: 0440
    items:
      - key: {{ .root.Values.apiKeys.key }}
        path: {{ .root.Values.apiKeys.key }}
{{- end }}
{{- if .root.Values.tls.enabled }}
- name: tls
  secret:
    secretName: {{ index .root.Values.tls.secrets .role }}
    defaultMode: 0440
{{- end }}
{{- if .root.Values.models.claimName }}
- name: models
  persistentVolumeClaim:
    claimName: {{ .root.Values.models.claimName }}
    readOnly: true
{{- end }}
{{- with $v.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end }}
