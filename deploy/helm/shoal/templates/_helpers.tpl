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

{{/* Stable DNS name of pod <ordinal>: <fullname>-<i>.<headless>.<namespace>.svc.<clusterDomain> */}}
{{- define "shoal.podHost" -}}
{{- $ := index . 0 -}}
{{- printf "%s-%d.%s.%s.svc.%s" (include "shoal.fullname" $) (index . 1) (include "shoal.headless" $) $.Release.Namespace $.Values.clusterDomain -}}
{{- end -}}

{{/* SHOAL_PEERS: id=host for every pod; the id is the pod's name (= SHOAL_NODE_ID from
     metadata.name), ports come from SHOAL_CLIENT_PORT / SHOAL_HTTP_PORT / SHOAL_RAFT_PORT. */}}
{{- define "shoal.peers" -}}
{{- $full := include "shoal.fullname" . -}}
{{- $root := . -}}
{{- range $i := until (int .Values.replicas) -}}
{{- if $i }},{{ end }}{{ $full }}-{{ $i }}={{ include "shoal.podHost" (list $root $i) }}
{{- end -}}
{{- end -}}

{{- define "shoal.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
