{{/*
Names and labels shared by every template.
*/}}

{{/* The chart name, or nameOverride. */}}
{{- define "cotenant.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The prefix of resource names: fullnameOverride, else "<release>-<chart>", or just the release name
when it already contains the chart name (release "cotenant" gives "cotenant-operator").
*/}}
{{- define "cotenant.fullname" -}}
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

{{/* Name of the operator's Deployment, Service and RBAC objects. */}}
{{- define "cotenant.operator.fullname" -}}
{{- printf "%s-operator" (include "cotenant.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Name of the agents' RBAC objects. */}}
{{- define "cotenant.agent.fullname" -}}
{{- printf "%s-agent" (include "cotenant.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* "name-version" for the helm.sh/chart label. */}}
{{- define "cotenant.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The namespace agents live in: agents.namespace, else the release namespace. */}}
{{- define "cotenant.agents.namespace" -}}
{{- default .Release.Namespace .Values.agents.namespace }}
{{- end }}

{{/* Labels every object of the release carries (besides name, instance and component). */}}
{{- define "cotenant.commonLabels" -}}
helm.sh/chart: {{ include "cotenant.chart" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: cotenant
{{- end }}

{{/* Labels of objects that belong to the operator. */}}
{{- define "cotenant.operator.labels" -}}
{{ include "cotenant.commonLabels" . }}
{{ include "cotenant.operator.selectorLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Labels that select the operator's pods; never change them (Deployment selectors are immutable). */}}
{{- define "cotenant.operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cotenant.name" . }}-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels of chart objects that belong to the agents (ServiceAccount, RBAC, NetworkPolicy, pool). */}}
{{- define "cotenant.agent.labels" -}}
{{ include "cotenant.commonLabels" . }}
app.kubernetes.io/name: cotenant-agent
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: agent
{{- end }}

{{/*
Labels that select agent pods. The operator, not this chart, creates agent pods and sets these
labels on them; they do not depend on the release.
*/}}
{{- define "cotenant.agent.selectorLabels" -}}
app.kubernetes.io/name: cotenant-agent
{{- end }}

{{/* "repository:tag" of an image values block, the tag defaulting to the chart's appVersion. */}}
{{- define "cotenant.image" -}}
{{- $image := index . 0 }}
{{- $root := index . 1 }}
{{- printf "%s:%s" $image.repository (default $root.Chart.AppVersion $image.tag) }}
{{- end }}
