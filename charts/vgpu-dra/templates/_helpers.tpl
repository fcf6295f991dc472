{{/* The chart's name, and the name every object of this release carries (63 characters at most). */}}
{{- define "vgpu-dra.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "vgpu-dra.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The service account the driver pods run as; the RBAC and the admission policy name it. */}}
{{- define "vgpu-dra.serviceAccountName" -}}
{{- include "vgpu-dra.fullname" . -}}
{{- end -}}

{{- define "vgpu-dra.selectorLabels" -}}
app.kubernetes.io/name: {{ include "vgpu-dra.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "vgpu-dra.labels" -}}
{{ include "vgpu-dra.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The sharing configuration file the driver reads with --config: HAMi's device config when
given as text, else the file made from the sharing values. */}}
{{- define "vgpu-dra.config" -}}
{{- if .Values.deviceConfig.content -}}
{{ .Values.deviceConfig.content }}
{{- else -}}
driverName: {{ .Values.driverName | quote }}
deviceSplitCount: {{ .Values.deviceSplitCount }}
deviceMemoryScaling: {{ .Values.deviceMemoryScaling }}
deviceCoreScaling: {{ .Values.deviceCoreScaling }}
filterDevices:
  uuid: {{ .Values.filterDevices.uuid | default list | toJson }}
  index: {{ .Values.filterDevices.index | default list | toJson }}
nodeConfig: {{ .Values.nodeConfig | default list | toJson }}
{{- end -}}
{{- end -}}

{{/* Whether the driver reads HAMi's device config (text or an existing ConfigMap). */}}
{{- define "vgpu-dra.hamiDeviceConfig" -}}
{{- if and .Values.deviceConfig.content .Values.deviceConfig.existingConfigMap -}}
{{- fail "deviceConfig: set content or existingConfigMap, not both" -}}
{{- end -}}
{{- if or .Values.deviceConfig.content .Values.deviceConfig.existingConfigMap -}}true{{- end -}}
{{- end -}}
