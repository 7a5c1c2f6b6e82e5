{{/* Name of every object: the release name when it already says "shoal", else <release>-shoal.
     At most 52 characters, so pod names (<name>-<ordinal>) and StatefulSet labels stay within 63. */}}
{{- define "shoal.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" -}}
{{- else if contains "shoal" .Release.Name -}}
{{- .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-shoal" .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Headless Service: per-pod DNS names for Raft peers and for clients following the topology. */}}
{{- define "shoal.headless" -}}{{ include "shoal.fullname" . | trunc 46 | trimSuffix "-" }}-peers{{- end -}}

{{/* The ConfigMap holding the cluster id (identity.yaml). */}}
{{- define "shoal.identityName" -}}{{ include "shoal.fullname" . }}-identity{{- end -}}

{{- define "shoal.secretName" -}}{{ .Values.cluster.existingSecret | default (include "shoal.fullname" .) }}{{- end -}}

{{- define "shoal.selectorLabels" -}}
app.kubernetes.io/name: shoal
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "shoal.labels" -}}
{{ include "shoal.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* DNS suffix of every pod: <headless>.<namespace>.svc.<clusterDomain> */}}
{{- define "shoal.podDomain" -}}
{{- printf "%s.%s.svc.%s" (include "shoal.headless" .) .Release.Namespace .Values.clusterDomain -}}
{{- end -}}

{{/* Stable DNS name of pod <ordinal>: <fullname>-<i>.<headless>.<namespace>.svc.<clusterDomain> */}}
{{- define "shoal.podHost" -}}
{{- $ := index . 0 -}}
{{- printf "%s-%d.%s" (include "shoal.fullname" $) (index . 1) (include "shoal.podDomain" $) -}}
{{- end -}}

{{/* How many pods the cluster was created with: what the identity ConfigMap recorded on the first
     install (upgrades never change it), else initialReplicas, else replicas. Fails when
     initialReplicas contradicts the recorded count or exceeds replicas on install. */}}
{{- define "shoal.bootstrapReplicas" -}}
{{- $current := (lookup "v1" "ConfigMap" .Release.Namespace (include "shoal.identityName" .)).data | default dict -}}
{{- $stored := get $current "bootstrap-replicas" -}}
{{- $wanted := int .Values.initialReplicas -}}
{{- if $stored -}}
{{- if and $wanted (ne $wanted (int $stored)) -}}
{{- fail (printf "initialReplicas is %d, but the cluster was created with %s pods (ConfigMap %s): the nodes a cluster was created with never change" $wanted $stored (include "shoal.identityName" .)) -}}
{{- end -}}
{{- $stored -}}
{{- else -}}
{{- if gt $wanted (int .Values.replicas) -}}
{{- fail (printf "initialReplicas (%d) cannot exceed replicas (%d)" $wanted (int .Values.replicas)) -}}
{{- end -}}
{{- $wanted | default (int .Values.replicas) -}}
{{- end -}}
{{- end -}}

{{/* SHOAL_PEERS: id=host for every pod the cluster was created with; the id is the pod's name
     (= SHOAL_NODE_ID from metadata.name), ports come from SHOAL_CLIENT_PORT / SHOAL_HTTP_PORT /
     SHOAL_RAFT_PORT. A later pod names itself with SHOAL_NODE_HOST and learns the other later
     pods from the cluster's registry, so scaling changes no pod's environment (no rolling restart). */}}
{{- define "shoal.peers" -}}
{{- $full := include "shoal.fullname" . -}}
{{- $root := . -}}
{{- range $i := until (int (include "shoal.bootstrapReplicas" .)) -}}
{{- if $i }},{{ end }}{{ $full }}-{{ $i }}={{ include "shoal.podHost" (list $root $i) }}
{{- end -}}
{{- end -}}

{{/* SHOAL_BOOTSTRAP_NODES: the ids of the pods the cluster was created with. */}}
{{- define "shoal.bootstrapNodes" -}}
{{- $full := include "shoal.fullname" . -}}
{{- range $i := until (int (include "shoal.bootstrapReplicas" .)) -}}
{{- if $i }},{{ end }}{{ $full }}-{{ $i }}
{{- end -}}
{{- end -}}

{{- define "shoal.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* The node's environment, the same for `shoal node` and the pod steps around it (`shoal pod join`
     in the init container, `shoal pod leave` in the preStop hook): every variable is read by
     shoal.cluster.config.load_config (ENV_VARS). */}}
{{- define "shoal.env" -}}
- name: SHOAL_NODE_ID        # the pod's name: <fullname>-<ordinal>, also its id in SHOAL_PEERS
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: SHOAL_PEERS           # the pods the cluster was created with (fixed: scaling restarts no pod)
  value: {{ include "shoal.peers" . | quote }}
- name: SHOAL_BOOTSTRAP_NODES
  value: {{ include "shoal.bootstrapNodes" . | quote }}
- name: SHOAL_NODE_HOST        # this pod's stable name; a later pod joins with it
  value: "$(SHOAL_NODE_ID).{{ include "shoal.podDomain" . }}"
- name: SHOAL_CLUSTER_ID     # made once by the chart and kept (identity.yaml)
  valueFrom:
    configMapKeyRef:
      name: {{ include "shoal.identityName" . }}
      key: cluster-id
- name: SHOAL_PARTITIONS
  value: {{ .Values.cluster.partitions | int | quote }}
- name: SHOAL_REPLICATION
  value: {{ .Values.cluster.replication | int | quote }}
- name: SHOAL_SESSION_GRACE_MS
  value: {{ .Values.cluster.sessionGraceMs | int | quote }}
- name: SHOAL_FRAME_BYTES_MAX
  value: {{ .Values.cluster.frameBytesMax | int64 | quote }}
- name: SHOAL_DASHBOARD_READ_ONLY
  value: {{ .Values.cluster.dashboardReadOnly | quote }}
- name: SHOAL_SYNC_INTERVAL_MS
  value: {{ .Values.cluster.syncIntervalMs | int | quote }}
- name: SHOAL_DISK_FREE_MIN_BYTES
  value: {{ .Values.cluster.diskFreeMinBytes | int64 | quote }}
- name: SHOAL_REPAIR_DAMAGED
  value: {{ .Values.cluster.repairDamaged | quote }}
- name: SHOAL_CLIENT_PORT
  value: {{ .Values.ports.client | int | quote }}
- name: SHOAL_HTTP_PORT
  value: {{ .Values.ports.http | int | quote }}
- name: SHOAL_RAFT_PORT
  value: {{ .Values.ports.raft | int | quote }}
- name: SHOAL_FRAME_TIMEOUT_MS
  value: {{ .Values.limits.frameTimeoutMs | int | quote }}
- name: SHOAL_UNAUTHENTICATED_IDLE_MS
  value: {{ .Values.limits.unauthenticatedIdleMs | int | quote }}
- name: SHOAL_CONNECTIONS_MAX
  value: {{ .Values.limits.connectionsMax | int | quote }}
- name: SHOAL_CONNECTIONS_PER_ADDRESS_MAX
  value: {{ .Values.limits.connectionsPerAddressMax | int | quote }}
- name: SHOAL_OUTPUT_HIGH_BYTES
  value: {{ .Values.limits.outputHighBytes | int64 | quote }}
- name: SHOAL_OUTPUT_MAX_BYTES
  value: {{ .Values.limits.outputMaxBytes | int64 | quote }}
- name: SHOAL_UNFINISHED_BYTES_MAX
  value: {{ .Values.limits.unfinishedBytesMax | int64 | quote }}
- name: SHOAL_MEMORY_MAX_BYTES
  value: {{ .Values.limits.memoryMaxBytes | int64 | quote }}
- name: SHOAL_HTTP_CONNECTIONS_MAX
  value: {{ .Values.limits.httpConnectionsMax | int | quote }}
- name: SHOAL_HTTP_HEADER_TIMEOUT_MS
  value: {{ .Values.limits.httpHeaderTimeoutMs | int | quote }}
- name: SHOAL_HTTP_KEEPALIVE_TIMEOUT_MS
  value: {{ .Values.limits.httpKeepaliveTimeoutMs | int | quote }}
{{- if .Values.tls.enabled }}
# The tls volume maps the Secret's keys to these fixed names.
- name: SHOAL_TLS_CERT
  value: /etc/shoal/tls/tls.crt
- name: SHOAL_TLS_KEY
  value: /etc/shoal/tls/tls.key
{{- if .Values.tls.caKey }}
- name: SHOAL_TLS_CA
  value: /etc/shoal/tls/ca.crt
{{- end }}
- name: SHOAL_TLS_CLIENT_CERTS
  value: {{ .Values.tls.clientCerts | quote }}
{{- end }}
- name: SHOAL_LISTEN
  value: "0.0.0.0"
- name: SHOAL_DATA_DIR
  value: /data
- name: SHOAL_CLUSTER_SECRET
  valueFrom:
    secretKeyRef:
      name: {{ include "shoal.secretName" . }}
      key: cluster-secret
- name: SHOAL_AUTH_TOKENS
  valueFrom:
    secretKeyRef:
      name: {{ include "shoal.secretName" . }}
      key: auth-tokens
      optional: true
{{- end -}}
