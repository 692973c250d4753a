{{/* Names and labels shared by every template. */}}

{{- define "ordered-sidecar.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "ordered-sidecar.webhook" -}}
{{- printf "%s-webhook" (include "ordered-sidecar.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "ordered-sidecar.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "ordered-sidecar.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "ordered-sidecar.webhookSelector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: webhook
{{- end -}}

{{- define "ordered-sidecar.tlsSecret" -}}
{{- if .Values.webhook.tls.certManager.enabled -}}
{{- printf "%s-tls" (include "ordered-sidecar.webhook" .) -}}
{{- else -}}
{{- required "webhook.tls.secretName is required when webhook.tls.certManager.enabled is false" .Values.webhook.tls.secretName -}}
{{- end -}}
{{- end -}}
