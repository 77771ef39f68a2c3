{{/* Names, labels and images shared by the templates. */}}

{{/* The base name of every object: the release name, with "-tessera" unless it already says so. */}}
{{- define "tessera.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tessera.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one component: (dict "ctx" $ "component" "scheduler"). */}}
{{- define "tessera.selectorLabels" -}}
app.kubernetes.io/name: {{ .ctx.Chart.Name }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "tessera.componentLabels" -}}
{{ include "tessera.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* An image reference: (dict "image" .Values.x.image "default" "tag"). */}}
{{- define "tessera.image" -}}
{{- printf "%s:%s" .image.repository (default .default .image.tag) -}}
{{- end -}}

{{/* The cluster's Kubernetes version as vX.Y.Z (distributions add suffixes). */}}
{{- define "tessera.kubeVersion" -}}
{{- regexFind "v[0-9]+\\.[0-9]+\\.[0-9]+" .Capabilities.KubeVersion.Version -}}
{{- end -}}

{{- define "tessera.schedulerServiceAccount" -}}{{ include "tessera.fullname" . }}-scheduler{{- end -}}
{{- /* The agents' Leases (tessera-agent-<node>): in the release namespace unless set, so each is owned by its agent pod and goes with it. */ -}}
{{- define "tessera.agentLeaseNamespace" -}}{{ default .Release.Namespace .Values.agent.leaseNamespace }}{{- end -}}
{{- define "tessera.agentServiceAccount" -}}{{ include "tessera.fullname" . }}-node-agent{{- end -}}
{{- define "tessera.webhookService" -}}{{ include "tessera.fullname" . }}-controller{{- end -}}
{{- define "tessera.webhookSecret" -}}{{ include "tessera.fullname" . }}-webhook-tls{{- end -}}

{{/*
The webhook's CA and serving certificate, issued by the chart (certManager.enabled
false). An existing Secret is kept while its certificate is valid for more than
webhook.certificate.renewBeforeDays; otherwise (first install, or near expiry) a
new CA and certificate are issued. Computed once per render and shared by the
Secret, the webhook configuration and the Deployment's checksum.
*/}}
{{- define "tessera.webhookCerts" -}}
{{- if not .Values._webhookCerts -}}
{{- $name := include "tessera.webhookSecret" . -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace $name -}}
{{- $renewAt := add (now | unixEpoch) (mul .Values.webhook.certificate.renewBeforeDays 86400) -}}
{{- $notAfter := 0 -}}
{{- if $existing -}}
{{- $notAfter = index ($existing.metadata.annotations | default dict) "tessera.dev/not-after" | default "0" | atoi -}}
{{- end -}}
{{- if and $existing (gt $notAfter $renewAt) (index $existing.data "ca.crt") -}}
{{- $_ := set .Values "_webhookCerts" (dict "ca" (index $existing.data "ca.crt" | b64dec) "cert" (index $existing.data "tls.crt" | b64dec) "key" (index $existing.data "tls.key" | b64dec) "notAfter" $notAfter) -}}
{{- else -}}
{{- $svc := include "tessera.webhookService" . -}}
{{- $ns := .Release.Namespace -}}
{{- $days := int .Values.webhook.certificate.validityDays -}}
{{- $ca := genCA (printf "%s-webhook-ca" (include "tessera.fullname" .)) (add $days 30 | int) -}}
{{- $dns := list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) -}}
{{- $cert := genSignedCert (printf "%s.%s.svc" $svc $ns) nil $dns $days $ca -}}
{{- $_ := set .Values "_webhookCerts" (dict "ca" $ca.Cert "cert" $cert.Cert "key" $cert.Key "notAfter" (add (now | unixEpoch) (mul $days 86400))) -}}
{{- end -}}
{{- end -}}
{{- toYaml .Values._webhookCerts -}}
{{- end -}}

{{/*
Every extended resource name Tessera schedules, one per line: NVIDIA's
(config.resources) and those of each vendor section (config.hygon with HAMi's
defaults for names left out, each config.vnpus.configs chip). The webhook's
match conditions and kube-scheduler's managedResources both use this list.
*/}}
{{- define "tessera.resourceNames" -}}
{{- $names := list -}}
{{- range $key := list "count" "memory" "memoryPercentage" "cores" "priority" -}}
{{- $names = append $names (index $.Values.config.resources $key) -}}
{{- end -}}
{{- if kindIs "map" .Values.config.hygon -}}
{{- $hygon := .Values.config.hygon -}}
{{- $names = append $names ($hygon.resourceCountName | default "hygon.com/dcunum") -}}
{{- $names = append $names ($hygon.resourceMemoryName | default "hygon.com/dcumem") -}}
{{- $names = append $names ($hygon.resourceCoreName | default "hygon.com/dcucores") -}}
{{- end -}}
{{- with .Values.config.vnpus -}}
{{- range .configs -}}
{{- $names = append $names .resourceName -}}
{{- $names = append $names .resourceMemoryName -}}
{{- if .resourceCoreName }}{{ $names = append $names .resourceCoreName }}{{ end -}}
{{- end -}}
{{- end -}}
{{- if kindIs "map" .Values.config.cambricon -}}
{{- $mlu := .Values.config.cambricon -}}
{{- $names = append $names ($mlu.resourceCountName | default "cambricon.com/vmlu") -}}
{{- $names = append $names ($mlu.resourceMemoryName | default "cambricon.com/mlu.smlu.vmemory") -}}
{{- $names = append $names ($mlu.resourceCoreName | default "cambricon.com/mlu.smlu.vcore") -}}
{{- end -}}
{{- if kindIs "map" .Values.config.mthreads -}}
{{- $mt := .Values.config.mthreads -}}
{{- $names = append $names ($mt.resourceCountName | default "mthreads.com/vgpu") -}}
{{- $names = append $names ($mt.resourceMemoryName | default "mthreads.com/sgpu-memory") -}}
{{- $names = append $names ($mt.resourceCoreName | default "mthreads.com/sgpu-core") -}}
{{- end -}}
{{- if kindIs "map" .Values.config.metax -}}
{{- $mx := .Values.config.metax -}}
{{- $names = append $names ($mx.resourceCountName | default "metax-tech.com/gpu") -}}
{{- $names = append $names ($mx.resourceVCountName | default "metax-tech.com/sgpu") -}}
{{- $names = append $names ($mx.resourceVMemoryName | default "metax-tech.com/vmemory") -}}
{{- $names = append $names ($mx.resourceVCoreName | default "metax-tech.com/vcore") -}}
{{- end -}}
{{- if kindIs "map" .Values.config.enflame -}}
{{- $gcu := .Values.config.enflame -}}
{{- $names = append $names ($gcu.resourceNameGCU | default "enflame.com/gcu") -}}
{{- $names = append $names ($gcu.resourceNameDRSGCU | default "enflame.com/drs-gcu") -}}
{{- $names = append $names ($gcu.resourceNameGCUMemory | default "enflame.com/gcu-memory") -}}
{{- $names = append $names ($gcu.resourceNameGCUCore | default "enflame.com/gcu-core") -}}
{{- if $gcu.resourceNameVGCU }}{{ $names = append $names $gcu.resourceNameVGCU }}{{ end -}}
{{- if $gcu.resourceNameVGCUPercentage }}{{ $names = append $names $gcu.resourceNameVGCUPercentage }}{{ end -}}
{{- end -}}
{{- if kindIs "map" .Values.config.kunlun -}}
{{- $xpu := .Values.config.kunlun -}}
{{- $names = append $names ($xpu.resourceCountName | default "kunlunxin.com/xpu") -}}
{{- $names = append $names ($xpu.resourceVCountName | default "kunlunxin.com/vxpu") -}}
{{- $names = append $names ($xpu.resourceVMemoryName | default "kunlunxin.com/vxpu-memory") -}}
{{- end -}}
{{- if kindIs "map" .Values.config.awsneuron -}}
{{- $aws := .Values.config.awsneuron -}}
{{- $names = append $names ($aws.resourceCountName | default "aws.amazon.com/neuron") -}}
{{- $names = append $names ($aws.resourceCoreName | default "aws.amazon.com/neuroncore") -}}
{{- end -}}
{{- if kindIs "map" .Values.config.amd -}}
{{- $amd := .Values.config.amd -}}
{{- $names = append $names ($amd.resourceCountName | default "amd.com/gpu") -}}
{{- $mem := ternary $amd.resourceMemoryName "amd.com/gpumem" (hasKey $amd "resourceMemoryName") -}}
{{- $cores := ternary $amd.resourceCoreName "amd.com/gpucores" (hasKey $amd "resourceCoreName") -}}
{{- if $mem }}{{ $names = append $names $mem }}{{ end -}}
{{- if $cores }}{{ $names = append $names $cores }}{{ end -}}
{{- end -}}
{{- if kindIs "map" .Values.config.vastai -}}
{{- $names = append $names (.Values.config.vastai.resourceCountName | default "vastaitech.com/va") -}}
{{- end -}}
{{- if kindIs "map" .Values.config.biren -}}
{{- $names = append $names (.Values.config.biren.resourceCountName | default "birentech.com/gpu") -}}
{{- end -}}
{{- range .Values.config.iluvatars -}}
{{- $names = append $names .resourceCountName -}}
{{- $names = append $names .resourceMemoryName -}}
{{- if .resourceCoreName }}{{ $names = append $names .resourceCoreName }}{{ end -}}
{{- end -}}
{{- join "\n" (uniq $names) -}}
{{- end -}}

{{/*
A CEL condition on a resource name `k`: it is one of Tessera's resources
(tessera.resourceNames), e.g. `k in ['nvidia.com/gpu', 'nvidia.com/gpumem', ...]`.
Exact names, not a prefix: other resources of the same vendor (static MIG's
`nvidia.com/mig-3g.20gb`, another device plugin's) are not Tessera's to admit.
*/}}
{{- define "tessera.gpuResourceMatch" -}}
{{- $names := list -}}
{{- range $name := splitList "\n" (include "tessera.resourceNames" .) -}}
{{- $names = append $names (printf "'%s'" $name) -}}
{{- end -}}
k in [{{ join ", " $names }}]
{{- end -}}

{{/* A CEL condition on `object` (a Pod): a container or init container names a GPU resource. */}}
{{- define "tessera.gpuPodCondition" -}}
{{- $match := include "tessera.gpuResourceMatch" . -}}
(object.spec.containers + (has(object.spec.initContainers) ? object.spec.initContainers : []))
.exists(c, has(c.resources) && ((has(c.resources.limits) && c.resources.limits.exists(k, {{ $match }}))
|| (has(c.resources.requests) && c.resources.requests.exists(k, {{ $match }}))))
{{- end -}}
