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

{{/* The webhook Deployment (`tpuslice webhook`): its name, and labels of its own. The
name label differs from the operator's, so no selector of the operator's (its
Deployment's, immutable, the PodDisruptionBudget's, the NetworkPolicy's) matches a
webhook pod, and the webhook Service selects webhook pods alone. */}}
{{- define "tpuslice.webhookName" -}}
{{- printf "%s-webhook" (include "tpuslice.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tpuslice.webhookSelectorLabels" -}}
app.kubernetes.io/name: {{ printf "%s-webhook" (include "tpuslice.name" .) | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tpuslice.webhookLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "tpuslice.webhookSelectorLabels" . }}
app.kubernetes.io/component: webhook
app.kubernetes.io/part-of: {{ include "tpuslice.name" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "tpuslice.webhookServiceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "tpuslice.webhookName" .) .Values.serviceAccount.webhookName -}}
{{- else -}}
{{- required "serviceAccount.webhookName is required when serviceAccount.create is false" .Values.serviceAccount.webhookName -}}
{{- end -}}
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

{{/* The operator image: repository@digest when a digest is set (the tag is then not used), else repository:tag. */}}
{{- define "tpuslice.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{/* "true" when /metrics listens on loopback only (for a proxy sidecar in the pod), else empty. */}}
{{- define "tpuslice.metricsOnLoopback" -}}
{{- if has .Values.metrics.bindAddress (list "127.0.0.1" "::1") -}}true{{- end -}}
{{- end -}}

{{/* The probe, webhook and metrics ports must differ: a probe on the webhook port would be
closed by a NetworkPolicy that admits only the control plane there. */}}
{{- define "tpuslice.checkPorts" -}}
{{- $health := int .Values.operator.healthPort -}}
{{- if and .Values.webhook.enabled (eq $health (int .Values.webhook.port)) -}}
{{- fail (printf "operator.healthPort and webhook.port are both %d: give the probes a port of their own" $health) -}}
{{- end -}}
{{- if and .Values.metrics.enabled (eq $health (int .Values.metrics.port)) -}}
{{- fail (printf "operator.healthPort and metrics.port are both %d: give each its own port" $health) -}}
{{- end -}}
{{- if and .Values.webhook.enabled .Values.metrics.enabled (eq (int .Values.webhook.port) (int .Values.metrics.port)) -}}
{{- fail (printf "webhook.port and metrics.port are both %d: give each its own port" (int .Values.metrics.port)) -}}
{{- end -}}
{{- end -}}
