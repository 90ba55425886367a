{{/* The name of every object: the release's, with the chart's unless it holds it already. */}}
{{- define "tollgate.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tollgate.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tollgate.labels" -}}
{{ include "tollgate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "tollgate.rulesConfigMap" -}}
{{- .Values.rules.existingConfigMap | default (printf "%s-rules" (include "tollgate.fullname" .)) -}}
{{- end -}}

{{/* HTTPS when the HTTP listener serves TLS (tls.secretName and tls.http). */}}
{{- define "tollgate.httpScheme" -}}
{{- if and .Values.tls.secretName .Values.tls.http -}}HTTPS{{- else -}}HTTP{{- end -}}
{{- end -}}

{{/* The values no Deployment could run with stop the rendering, with what to set. */}}
{{- define "tollgate.check" -}}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.redis.secretName) -}}
{{- fail "redis.secretName: more than one replica needs Redis to share the limits (without it each replica keeps limits of its own); set redis.secretName, or replicaCount: 1" -}}
{{- end -}}
{{- if and (not .Values.rules.existingConfigMap) (not .Values.rules.files) -}}
{{- fail "rules: set rules.files or rules.existingConfigMap; tollgate serve does not start without rules" -}}
{{- end -}}
{{- if and .Values.tls.clientCA (not .Values.tls.secretName) -}}
{{- fail "tls.clientCA: needs tls.secretName, the Secret whose ca.crt signs the client certificates" -}}
{{- end -}}
{{- end -}}
