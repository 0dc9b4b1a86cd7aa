{{/* vim: set filetype=mustache: */}}
{{/*
Names and labels follow the prometheus-community charts (prometheus-node-exporter's
_helpers.tpl): names truncated to 63 characters (DNS-1123 labels), the recommended
app.kubernetes.io labels (https://kubernetes.io/docs/concepts/overview/working-with-objects/common-labels/).
*/}}
{{- define "capalarm.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "capalarm.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The name of one workload's resources: <fullname>-node or <fullname>-cluster. */}}
{{- define "capalarm.workloadName" -}}
{{- printf "%s-%s" (include "capalarm.fullname" .root | trunc 55 | trimSuffix "-") (include "capalarm.component" .workload) }}
{{- end }}

{{/* daemonset -> node, deployment -> cluster: the app.kubernetes.io/component label. */}}
{{- define "capalarm.component" -}}
{{- if eq . "daemonset" }}node{{ else }}cluster{{ end }}
{{- end }}

{{- define "capalarm.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "capalarm.selectorLabels" -}}
app.kubernetes.io/name: {{ include "capalarm.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "capalarm.labels" -}}
helm.sh/chart: {{ include "capalarm.chart" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: {{ include "capalarm.name" . }}
{{ include "capalarm.selectorLabels" . }}
{{- with .Chart.AppVersion }}
app.kubernetes.io/version: {{ . | quote }}
{{- end }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Labels and selector labels of one workload: (dict "root" $ "workload" "daemonset"). */}}
{{- define "capalarm.workloadLabels" -}}
{{ include "capalarm.labels" .root }}
app.kubernetes.io/component: {{ include "capalarm.component" .workload }}
{{- end }}

{{- define "capalarm.workloadSelectorLabels" -}}
{{ include "capalarm.selectorLabels" .root }}
app.kubernetes.io/component: {{ include "capalarm.component" .workload }}
{{- end }}

{{- define "capalarm.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride }}
{{- end }}

{{- define "capalarm.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "capalarm.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* registry/repository:tag[@digest]; the tag defaults to the chart's appVersion. */}}
{{- define "capalarm.image" -}}
{{- $registry := default .Values.image.registry .Values.global.imageRegistry }}
{{- $ref := printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- if $registry }}{{ $ref = printf "%s/%s" $registry $ref }}{{ end }}
{{- if .Values.image.digest }}{{ $ref = printf "%s@%s" $ref .Values.image.digest }}{{ end }}
{{- $ref }}
{{- end }}

{{- define "capalarm.imagePullSecrets" -}}
{{- range (concat .Values.global.imagePullSecrets .Values.imagePullSecrets) }}
{{- if kindIs "map" . }}
- {{ toYaml . | trim }}
{{- else }}
- name: {{ . }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Source types and surface kinds by the workload that runs them, as a dict
{daemonset: {kinds, sourceTypes}, deployment: {kinds, sourceTypes}}: files/placement.yaml,
generated from the service's kind registry (alarm/kinds/, each kind says where its sources
run) by scripts/gen_chart_files.py.  Node-local sources read this node's kernel log and
directories; registry sources poll services once for the whole cluster.
*/}}
{{- define "capalarm.placement" -}}
{{- .Files.Get "files/placement.yaml" }}
{{- end }}

{{/*
One workload's share of .Values.config, as YAML: (dict "root" $ "workload" "daemonset").
Its sources of the workload's types, the surfaces of the kinds those sources feed, the
per-kind keys (unclassified, aggregates) of those kinds, and every other key unchanged.
A source without `type` is `auto`, a surface without `kind` is `egress`, and a config without
`sources` has the service's default kernel source: the same defaults alarm/config.py applies.
*/}}
{{- define "capalarm.config" -}}
{{- $root := .root }}
{{- $node := eq .workload "daemonset" }}
{{- $config := deepCopy $root.Values.config }}
{{- $placement := include "capalarm.placement" $root | fromYaml }}
{{- $nodeTypes := $placement.daemonset.sourceTypes }}
{{- $clusterTypes := $placement.deployment.sourceTypes }}
{{- $allKinds := concat $placement.daemonset.kinds $placement.deployment.kinds }}
{{- $kinds := (get $placement .workload).kinds }}
{{- $allSources := ternary $config.sources (list (dict "name" "kernel")) (hasKey $config "sources") }}
{{- $sources := list }}
{{- range $allSources }}
{{- $type := default "auto" .type }}
{{- if not (or (has $type $nodeTypes) (has $type $clusterTypes)) }}
{{- fail (printf "config.sources: the chart does not know where source %q of type %q runs (node-local: %s; cluster-wide: %s)" (toString .name) $type (join ", " $nodeTypes) (join ", " $clusterTypes)) }}
{{- end }}
{{- if eq (has $type $nodeTypes) $node }}
{{- $sources = append $sources . }}
{{- end }}
{{- end }}
{{- $surfaces := list }}
{{- range (default list $config.surfaces) }}
{{- if not (has (default "egress" .kind) $allKinds) }}
{{- fail (printf "config.surfaces: the chart does not know where surface %q of kind %q goes (kinds: %s)" (toString .name) (toString .kind) (join ", " $allKinds)) }}
{{- end }}
{{- if has (default "egress" .kind) $kinds }}
{{- $surfaces = append $surfaces . }}
{{- end }}
{{- end }}
{{- $_ := set $config "sources" $sources }}
{{- $_ := set $config "surfaces" $surfaces }}
{{- range $key := list "unclassified" "aggregates" }}
{{- if hasKey $config $key }}
{{- $perKind := dict }}
{{- range $kind, $value := (get $config $key) }}
{{- if has $kind $kinds }}{{ $_ := set $perKind $kind $value }}{{ end }}
{{- end }}
{{- $_ := set $config $key $perKind }}
{{- end }}
{{- end }}
{{- $http := deepCopy (default dict $config.http) }}
{{- if hasKey $http "listen" }}
{{- fail "config.http.listen: the chart sets it from service.port (the Service, probes and ServiceMonitor use that port)" }}
{{- end }}
{{- $_ := set $http "listen" (printf "0.0.0.0:%d" (int $root.Values.service.port)) }}
{{- $_ := set $config "http" $http }}
{{- $_ := set $config "state_dir" (include "capalarm.stateDir" $root) }}
{{- toYaml $config }}
{{- end }}

{{- define "capalarm.stateDir" -}}
{{- default "/var/lib/capalarm" .Values.config.state_dir }}
{{- end }}

{{/* Whether a workload has sources: "true" or "" (templates cannot return booleans). */}}
{{- define "capalarm.hasSources" -}}
{{- $config := include "capalarm.config" . | fromYaml }}
{{- if and (gt (len $config.sources) 0) (get .root.Values .workload).enabled }}true{{ end }}
{{- end }}

{{/*
The DaemonSet's needs, from its sources: a dict with
  kmsg: [paths of /dev/kmsg devices]            (auto, kmsg sources)
  hostPaths: {path: hostPath type}              (read-only mounts at the same path: the host
                                                 journal for auto and journald sources, file
                                                 sources' directories, fs sources' trees)
  fs: true                                      (fs sources)
One dict keyed by path, so a directory two sources need is mounted once.
*/}}
{{- define "capalarm.nodeNeeds" -}}
{{- $config := include "capalarm.config" (dict "root" . "workload" "daemonset") | fromYaml }}
{{- $kmsg := dict }}
{{- $hostPaths := dict }}
{{- $fs := false }}
{{- range $config.sources }}
{{- $type := default "auto" .type }}
{{- if has $type (list "auto" "kmsg") }}
{{- $_ := set $kmsg (default "/dev/kmsg" .kmsg_path) true }}
{{- end }}
{{- if and (has $type (list "auto" "journald")) $.Values.daemonset.hostJournal }}
{{- /* journalctl reads the host's journal (persistent in /var/log/journal, volatile in
       /run/log/journal) for the machine named in /etc/machine-id */}}
{{- $_ := set $hostPaths "/var/log" "Directory" }}
{{- $_ := set $hostPaths "/run/log" "DirectoryOrCreate" }}
{{- $_ := set $hostPaths "/etc/machine-id" "File" }}
{{- end }}
{{- with .journal_directory }}{{ $_ := set $hostPaths (include "capalarm.globFreeDir" .) "Directory" }}{{ end }}
{{- if eq $type "file" }}
{{- range .paths }}
{{- $_ := set $hostPaths (include "capalarm.globFreeDir" (dir .)) "Directory" }}
{{- end }}
{{- end }}
{{- if eq $type "fs" }}
{{- $fs = true }}
{{- range .paths }}
{{- $_ := set $hostPaths (include "capalarm.globFreeDir" .) "Directory" }}
{{- end }}
{{- end }}
{{- end }}
{{- toYaml (dict "kmsg" (keys $kmsg | sortAlpha) "hostPaths" $hostPaths "fs" $fs) }}
{{- end }}

{{/* A path with every component from the first glob character on removed: what to mount. */}}
{{- define "capalarm.globFreeDir" -}}
{{- $path := regexReplaceAll "/[^/]*[*?\\[].*$" . "" }}
{{- if not (and (hasPrefix "/" $path) (ne $path "/")) }}
{{- fail (printf "config.sources: cannot mount %q from the host: a source path must be absolute, below /, with no glob in its first component" .) }}
{{- end }}
{{- $path }}
{{- end }}

{{/* The capabilities the DaemonSet's sources need (capabilities(7)). */}}
{{- define "capalarm.nodeCapabilities" -}}
{{- $needs := include "capalarm.nodeNeeds" . | fromYaml }}
{{- $ds := .Values.daemonset }}
{{- $caps := list }}
{{- if $needs.kmsg }}
{{- /* /dev/kmsg with kernel.dmesg_restrict=1 (syslog(2)) */}}
{{- $caps = append $caps "SYSLOG" }}
{{- if $ds.kmsg.realtime }}{{ $caps = append $caps "SYS_NICE" }}{{ end }}
{{- end }}
{{- if and $needs.fs (or $ds.fsReadAll $ds.fanotify) }}
{{- /* read and search any directory; fanotify(7) also needs it for open_by_handle_at(2) */}}
{{- $caps = append $caps "DAC_READ_SEARCH" }}
{{- end }}
{{- if and $needs.fs $ds.fanotify }}
{{- /* fanotify_init(2): CAP_SYS_ADMIN for FAN_MARK_FILESYSTEM */}}
{{- $caps = append $caps "SYS_ADMIN" }}
{{- end }}
{{- toYaml (concat $caps $ds.extraCapabilities | uniq) }}
{{- end }}

{{/* The command line; the image's ENTRYPOINT is the same (Dockerfile). */}}
{{- define "capalarm.command" -}}
- capalarm
- run
- --config
- /etc/capalarm/config.yaml
{{- end }}

{{/* A probe from values; an httpGet probe says HTTPS where the web config serves TLS. */}}
{{- define "capalarm.probe" -}}
{{- $probe := deepCopy .probe }}
{{- if and $probe.httpGet .root.Values.webConfig.existingSecret .root.Values.webConfig.tls }}
{{- $_ := set $probe.httpGet "scheme" "HTTPS" }}
{{- end }}
{{- toYaml $probe }}
{{- end }}

{{/* prometheus.io annotations for annotation-based discovery, then service.annotations. */}}
{{- define "capalarm.serviceAnnotations" -}}
{{- $out := dict }}
{{- if .Values.service.scrapeAnnotations }}
{{- $tls := and .Values.webConfig.existingSecret .Values.webConfig.tls }}
{{- $_ := set $out "prometheus.io/scrape" "true" }}
{{- $_ := set $out "prometheus.io/port" (toString .Values.service.port) }}
{{- $_ := set $out "prometheus.io/path" "/metrics" }}
{{- $_ := set $out "prometheus.io/scheme" (ternary "https" "http" (not (not $tls))) }}
{{- end }}
{{- $out = merge (deepCopy (.Values.service.annotations | default dict)) $out }}
{{- with $out }}
{{- toYaml . }}
{{- end }}
{{- end }}

{{/* Volumes both workloads mount: (dict "root" $ "workload" "daemonset"). */}}
{{- define "capalarm.commonVolumes" -}}
- name: config
  configMap:
    name: {{ include "capalarm.workloadName" . }}
- name: tmp
  emptyDir:
    sizeLimit: 64Mi
{{- with .root.Values.webConfig.existingSecret }}
- name: web-config
  secret:
    secretName: {{ . }}
    defaultMode: 0440
{{- end }}
{{- range .root.Values.secretMounts }}
{{- if has $.workload (default (list "daemonset" "deployment") .workloads) }}
- name: secret-{{ .name }}
  secret:
    secretName: {{ .existingSecret }}
    defaultMode: 0400
{{- end }}
{{- end }}
{{- end }}

{{- define "capalarm.commonVolumeMounts" -}}
- name: config
  mountPath: /etc/capalarm/config.yaml
  subPath: config.yaml
  readOnly: true
- name: tmp
  mountPath: /tmp
- name: state
  mountPath: {{ include "capalarm.stateDir" .root }}
{{- if .root.Values.webConfig.existingSecret }}
- name: web-config
  mountPath: /etc/capalarm/web
  readOnly: true
{{- end }}
{{- range .root.Values.secretMounts }}
{{- if has $.workload (default (list "daemonset" "deployment") .workloads) }}
- name: secret-{{ .name }}
  mountPath: /etc/capalarm/secrets/{{ .name }}
  readOnly: true
{{- end }}
{{- end }}
{{- end }}

{{/* The container both workloads run, less securityContext and workload volumes. */}}
{{- define "capalarm.containerCommon" -}}
image: {{ include "capalarm.image" .root }}
imagePullPolicy: {{ .root.Values.image.pullPolicy }}
command:
  {{- include "capalarm.command" .root | nindent 2 }}
{{- $args := list }}
{{- with .root.Values.webConfig.existingSecret }}
{{- $args = append $args (printf "--web.config.file=/etc/capalarm/web/%s" $.root.Values.webConfig.key) }}
{{- end }}
{{- $args = concat $args ((get .root.Values .workload).extraArgs | default list) }}
{{- with $args }}
args:
  {{- toYaml . | nindent 2 }}
{{- end }}
ports:
  - name: metrics
    containerPort: {{ .root.Values.service.port }}
    protocol: TCP
{{- with (get .root.Values .workload).env }}
env:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .root.Values.livenessProbe }}
livenessProbe:
  {{- include "capalarm.probe" (dict "probe" . "root" $.root) | nindent 2 }}
{{- end }}
{{- with .root.Values.readinessProbe }}
readinessProbe:
  {{- include "capalarm.probe" (dict "probe" . "root" $.root) | nindent 2 }}
{{- end }}
{{- with (get .root.Values .workload).resources }}
resources:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Pod-level scheduling keys both workloads share. */}}
{{- define "capalarm.podScheduling" -}}
{{- $w := get .root.Values .workload }}
{{- with $w.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with $w.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $w.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $w.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $w.terminationGracePeriodSeconds }}
terminationGracePeriodSeconds: {{ . }}
{{- end }}
{{- with (include "capalarm.imagePullSecrets" .root) }}
imagePullSecrets:
  {{- . | nindent 2 }}
{{- end }}
{{- end }}
