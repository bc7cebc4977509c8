{{/* Names are fixed, not release-prefixed: one initshift per cluster, and the webhook
     configuration's name decides its order among the mesh injectors. nameOverride changes
     the app.kubernetes.io/name label, fullnameOverride the objects' names (default: the name). */}}
{{- define "initshift.name" -}}
{{- .Values.nameOverride | default .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "initshift.fullname" -}}
{{- .Values.fullnameOverride | default (include "initshift.name" .) | trunc 50 | trimSuffix "-" -}}
{{- end -}}

{{- define "initshift.labels" -}}
app.kubernetes.io/name: {{ include "initshift.name" . }}
app.kubernetes.io/part-of: initshift
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "initshift.selector" -}}
app.kubernetes.io/name: {{ include "initshift.name" . }}
app.kubernetes.io/component: webhook
{{- end -}}

{{/* repository@digest when a digest is given (the tag is then ignored), else repository:tag. */}}
{{- define "initshift.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* What the monitors select: the Service (ServiceMonitor) carries these labels too. */}}
{{- define "initshift.metricsSelector" -}}
app.kubernetes.io/name: {{ include "initshift.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "initshift.subject" -}}
- kind: ServiceAccount
  name: {{ include "initshift.fullname" . }}
  namespace: {{ .Release.Namespace }}
{{- end -}}

{{/* name=url comma list, in name order (Go templates range over maps sorted by key). */}}
{{- define "initshift.quitEndpoints" -}}
{{- $items := list -}}
{{- range $name, $url := .Values.quitEndpoints -}}
{{- $items = append $items (printf "%s=%s" $name $url) -}}
{{- end -}}
{{- join "," $items -}}
{{- end -}}
