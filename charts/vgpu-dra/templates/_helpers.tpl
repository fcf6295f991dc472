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

{{/* Whether the driver writes its claims' status.devices: asked for, and on Kubernetes 1.36 or
later, where the API server lets a node's driver write only its own driver's entries of claims
allocated to its own node. Before 1.36, patch of resourceclaims/status would let every node's
driver rewrite any claim's allocation. */}}
{{- define "vgpu-dra.claimStatus" -}}
{{- if and .Values.claimStatus (semverCompare ">=1.36.0-0" .Capabilities.KubeVersion.Version) -}}true{{- end -}}
{{- end -}}

{{/* Whether the webhook is installed: it converts pods for this driver, so only with it. */}}
{{- define "vgpu-dra.webhook.enabled" -}}
{{- if and .Values.dra.enabled .Values.webhook.enabled -}}true{{- end -}}
{{- end -}}

{{/* The webhook's Deployment, Service, ServiceAccount, RBAC, PodDisruptionBudget and the
MutatingWebhookConfiguration it registers (cluster-scoped: the release name keeps it unique). */}}
{{- define "vgpu-dra.webhook.fullname" -}}
{{- printf "%s-webhook" (include "vgpu-dra.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The Secret the webhook keeps its CA and serving certificate in. */}}
{{- define "vgpu-dra.webhook.secretName" -}}
{{- printf "%s-tls" (include "vgpu-dra.webhook.fullname" .) | trunc 253 -}}
{{- end -}}

{{/* The webhook pods' labels; the component keeps its Service and PodDisruptionBudget off the
driver pods. */}}
{{- define "vgpu-dra.webhook.selectorLabels" -}}
{{ include "vgpu-dra.selectorLabels" . }}
app.kubernetes.io/component: webhook
{{- end -}}

{{/* The ConfigMap holding the device configuration, read by the driver and the webhook alike. */}}
{{- define "vgpu-dra.configMapName" -}}
{{- .Values.deviceConfig.existingConfigMap | default (include "vgpu-dra.fullname" .) -}}
{{- end -}}

{{/* Pod annotation that rolls the pods when the configuration changes. An existing ConfigMap is
not the chart's to read: only a change of its name or key rolls. */}}
{{- define "vgpu-dra.configChecksum" -}}
{{- if .Values.deviceConfig.existingConfigMap -}}
vgpu-dra.io/config-sha256: {{ printf "%s/%s" .Values.deviceConfig.existingConfigMap .Values.deviceConfig.existingConfigMapKey | sha256sum }}
{{- else -}}
vgpu-dra.io/config-sha256: {{ include "vgpu-dra.config" . | sha256sum }}
{{- end -}}
{{- end -}}

{{/* The image the driver and the webhook run (one binary, two roles). */}}
{{- define "vgpu-dra.image" -}}
{{ required "image.repository is empty: build the image from the Dockerfile, push it, and set image.repository (no image is published)" .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* Values that stop the install with a message, checked whatever else is enabled. */}}
{{- define "vgpu-dra.validate" -}}
{{- if .Values.devicePlugin.enabled -}}
{{- fail "devicePlugin.enabled=true: vgpu-dra has no device-plugin mode, it runs only as a DRA driver (dra.enabled); drop --set devicePlugin.enabled=true (false is accepted, as in HAMi's install line)" -}}
{{- end -}}
{{- if include "vgpu-dra.webhook.enabled" . -}}
{{- $_ := include "vgpu-dra.webhook.clientAuth" . -}}
{{- end -}}
{{- end -}}

{{/* Whether the webhook admits only the API server's client certificate. On without a CA, the
install stops and says what to set: the webhook would otherwise take reviews from any pod. */}}
{{- define "vgpu-dra.webhook.clientAuth" -}}
{{- if .Values.webhook.clientAuth.enabled -}}
{{- if not (trim .Values.webhook.clientAuth.caBundle) -}}
{{- fail "webhook.clientAuth.caBundle is empty: set it to the CA of the client certificate kube-apiserver presents to webhooks (--set-file webhook.clientAuth.caBundle=<file>; docs/security.md shows the API server's admission configuration), or set webhook.clientAuth.enabled=false to let any client that reaches the webhook send it reviews" -}}
{{- end -}}
true
{{- end -}}
{{- end -}}

{{/* The registration Job's ServiceAccount, ClusterRole and Job: the only identity that writes
which pods are sent to the webhook. */}}
{{- define "vgpu-dra.webhook.registrarName" -}}
{{- printf "%s-registrar" (include "vgpu-dra.webhook.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The arguments that say which pods are sent to the webhook and where: the same for the
webhook and its registration Job, so the caBundle the webhook keeps belongs to the webhooks the
Job registered. */}}
{{- define "vgpu-dra.webhook.registrationArgs" -}}
{{- $name := include "vgpu-dra.webhook.fullname" . -}}
- --service-name={{ $name }}
- --webhook-name={{ $name }}
# The same file the driver reads: HAMi's resource names and defaults.
- --config=/etc/vgpu-dra/config.yaml
- --driver-name={{ .Values.driverName }}
- --device-class={{ .Values.deviceClassName }}
- --mig-device-class={{ include "vgpu-dra.migDeviceClassName" . }}
- --timeout-seconds={{ .Values.webhook.timeoutSeconds }}
# Namespaces never sent to it; it adds its own, so an empty list passes only that one.
- --excluded-namespaces={{ .Values.webhook.excludedNamespaces | default (list .Release.Namespace) | join "," }}
# Pods of Volcano's scheduler keep a request Volcano counts (docs/volcano.md).
- --volcano-scheduler-names={{ .Values.webhook.volcano.schedulerNames | join "," }}
- --volcano-cpu-request={{ .Values.webhook.volcano.cpuRequest }}
# Every claim on the DeviceClass is charged to its namespace's GPU quotas (docs/quotas.md).
- --quotas={{ .Values.webhook.quotas }}
{{- end -}}

{{/* The DeviceClass of dynamic-MIG devices: migDeviceClassName, else mig.<deviceClassName> (as
NVIDIA's driver pairs gpu.nvidia.com with mig.nvidia.com). The webhook gets the same name. */}}
{{- define "vgpu-dra.migDeviceClassName" -}}
{{- .Values.migDeviceClassName | default (printf "mig.%s" .Values.deviceClassName) -}}
{{- end -}}

{{/* The host directory the NVIDIA driver is installed under: nvidiaDriverRoot when set, else
HAMi's hami-dra.drivers.nvidia.containerDriver (true: the GPU Operator's driver container, whose
files are under /run/nvidia/driver; false: the host), else the host. No trailing slash but "/". */}}
{{- define "vgpu-dra.driverRoot" -}}
{{- $container := dig "drivers" "nvidia" "containerDriver" "" (index .Values "hami-dra" | default dict) -}}
{{- $root := "/" -}}
{{- if .Values.nvidiaDriverRoot -}}
{{- $root = .Values.nvidiaDriverRoot -}}
{{- else if eq (toString $container) "true" -}}
{{- $root = "/run/nvidia/driver" -}}
{{- end -}}
{{- if eq $root "/" }}/{{ else }}{{ $root | trimSuffix "/" }}{{ end -}}
{{- end -}}

{{/* Whether cert-manager issues the webhook's certificate. */}}
{{- define "vgpu-dra.webhook.certManager" -}}
{{- if .Values.webhook.certManager.enabled -}}true{{- end -}}
{{- end -}}

{{/* The DNS names the API server may call the webhook's Service by. */}}
{{- define "vgpu-dra.webhook.dnsNames" -}}
{{- $svc := include "vgpu-dra.webhook.fullname" . -}}
{{- $ns := .Release.Namespace -}}
- {{ $svc }}
- {{ $svc }}.{{ $ns }}
- {{ $svc }}.{{ $ns }}.svc
- {{ $svc }}.{{ $ns }}.svc.cluster.local
{{- end -}}
