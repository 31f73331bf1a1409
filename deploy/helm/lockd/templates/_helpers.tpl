{{/* lockd.fullname: the StatefulSet's name, also the pods' name prefix. */}}
{{- define "lockd.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "lockd.headless" -}}{{ include "lockd.fullname" . }}-peers{{- end -}}

{{- define "lockd.domain" -}}
{{- printf "%s.%s.svc.%s" (include "lockd.headless" .) .Release.Namespace .Values.clusterDomain -}}
{{- end -}}

{{- define "lockd.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "lockd.labels" -}}
{{ include "lockd.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "lockd.scheme" -}}{{ if .Values.tls.enabled }}https{{ else }}http{{ end }}{{- end -}}

{{/* lockd.tlsSecret: the Secret holding tls.crt, tls.key and ca.crt. */}}
{{- define "lockd.tlsSecret" -}}
{{- if .Values.tls.secretName -}}{{ .Values.tls.secretName }}{{- else -}}{{ include "lockd.fullname" . }}-tls{{- end -}}
{{- end -}}

{{/* lockd.validate: refuse values that cannot make a safe cluster. */}}
{{- define "lockd.validate" -}}
{{- $r := int .Values.replicas -}}
{{- if or (lt $r 1) (eq (mod $r 2) 0) -}}
{{- fail (printf "replicas must be odd (1, 3 or 5): an even count raises the majority without surviving more failures; got %d" $r) -}}
{{- end -}}
{{- if and .Values.tls.enabled (not .Values.tls.secretName) (not .Values.tls.certManager.enabled) -}}
{{- fail "tls.enabled needs tls.secretName (a Secret with tls.crt, tls.key, ca.crt) or tls.certManager.enabled" -}}
{{- end -}}
{{- if and .Values.tls.certManager.enabled (not .Values.tls.certManager.issuerRef.name) -}}
{{- fail "tls.certManager.enabled needs tls.certManager.issuerRef.name (an Issuer or ClusterIssuer that signs with the cluster CA)" -}}
{{- end -}}
{{- if and .Values.auth.enabled (not .Values.auth.secretName) -}}
{{- fail "auth.enabled needs auth.secretName (a Secret with the auth file and this cluster's peer token)" -}}
{{- end -}}
{{- if not (has .Values.tls.clientAuth (list "none" "verify-if-given" "require")) -}}
{{- fail (printf "tls.clientAuth must be none, verify-if-given or require; got %q" .Values.tls.clientAuth) -}}
{{- end -}}
{{- end -}}
