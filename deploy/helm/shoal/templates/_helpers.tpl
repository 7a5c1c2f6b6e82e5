{{- define "shoal.fullname" -}}{{ .Release.Name }}-shoal{{- end -}}
{{- define "shoal.headless" -}}{{ include "shoal.fullname" . }}-peers{{- end -}}
{{- define "shoal.secretName" -}}{{ .Values.cluster.existingSecret | default (include "shoal.fullname" .) }}{{- end -}}
{{- define "shoal.labels" -}}
app.kubernetes.io/name: shoal
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
{{/* SHOAL_PEERS: every pod by its stable DNS name in the headless service. */}}
{{- define "shoal.peers" -}}
{{- $full := include "shoal.fullname" . -}}
{{- $svc := include "shoal.headless" . -}}
{{- $ns := .Release.Namespace -}}
{{- range $i := until (int .Values.replicas) -}}
{{- if $i }},{{ end }}{{ $full }}-{{ $i }}={{ $full }}-{{ $i }}.{{ $svc }}.{{ $ns }}.svc.cluster.local
{{- end -}}
{{- end -}}
