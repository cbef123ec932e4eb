{{/* Names and labels shared by every template. */}}

{{- define "tpuslice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tpuslice.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "tpuslice.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "tpuslice.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "tpuslice.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tpuslice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tpuslice.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "tpuslice.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The Service in front of the webhook port; the operator names it in the webhook configuration. */}}
{{- define "tpuslice.webhookService" -}}
{{- printf "%s-webhook" (include "tpuslice.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The Secret every replica shares the webhook's CA and serving certificate through (rendered empty; the first replica fills it). */}}
{{- define "tpuslice.webhookCerts" -}}
{{- printf "%s-webhook-certs" (include "tpuslice.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The Lease the replicas elect their leader with. */}}
{{- define "tpuslice.leaseName" -}}
{{- default (include "tpuslice.fullname" .) .Values.leaderElection.leaseName -}}
{{- end -}}

{{- define "tpuslice.certificate" -}}
{{- printf "%s-webhook" (include "tpuslice.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Where the webhook's tls.crt, tls.key and ca.crt live: the cert-manager Secret, or an emptyDir the operator writes its own CA into. */}}
{{- define "tpuslice.certDir" -}}
{{- if .Values.webhook.certManager.enabled -}}
/etc/tpuslice/webhook-certs
{{- else -}}
/tmp/tpuslice-webhook
{{- end -}}
{{- end -}}
