//! The chart's Grafana dashboard and PrometheusRule: rendered only when switched on (the rule only
//! where the monitoring.coreos.com/v1 API exists), well-formed, every panel querying something,
//! every alert described, every query naming metrics of cotenant's own, and both accepted by the
//! API server under strict field validation. The e2e test checks that every metric they query is
//! one the running operator or agents export.

#[path = "../common/monitoring.rs"]
mod monitoring;

use cotenant_e2e::{ControlPlane, TestNamespace};
use monitoring::{Monitoring, PROMETHEUS_RULE_API, RELEASE, exported, metric_names, render};
use serde_json::Value;
use std::collections::BTreeSet;

/// The `monitoring.coreos.com/v1` PrometheusRule CRD, reduced to the fields the chart writes,
/// with the Prometheus Operator's schema for them (the test control plane has no Prometheus
/// Operator). Structural, so the API server prunes and strictly validates against it.
const PROMETHEUS_RULE_CRD: &str = r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: prometheusrules.monitoring.coreos.com
spec:
  group: monitoring.coreos.com
  scope: Namespaced
  names:
    kind: PrometheusRule
    listKind: PrometheusRuleList
    plural: prometheusrules
    singular: prometheusrule
    shortNames: [promrule]
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          required: [spec]
          properties:
            apiVersion: {type: string}
            kind: {type: string}
            metadata: {type: object}
            spec:
              type: object
              properties:
                groups:
                  type: array
                  x-kubernetes-list-type: map
                  x-kubernetes-list-map-keys: [name]
                  items:
                    type: object
                    required: [name]
                    properties:
                      name: {type: string, minLength: 1}
                      interval:
                        type: string
                        pattern: '^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$'
                      labels:
                        type: object
                        additionalProperties: {type: string}
                      rules:
                        type: array
                        items:
                          type: object
                          required: [expr]
                          properties:
                            alert: {type: string}
                            record: {type: string}
                            expr:
                              anyOf: [{type: integer}, {type: string}]
                              x-kubernetes-int-or-string: true
                            for:
                              type: string
                              pattern: '^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$'
                            keep_firing_for:
                              type: string
                              minLength: 1
                            labels:
                              type: object
                              additionalProperties: {type: string}
                            annotations:
                              type: object
                              additionalProperties: {type: string}
"#;

/// Installs [`PROMETHEUS_RULE_CRD`] unless the cluster already serves PrometheusRules.
fn ensure_prometheus_rule_api(cp: &ControlPlane) {
    let crd = "crd/prometheusrules.monitoring.coreos.com";
    if cp.kubectl_ok(&["get", crd]).is_err() {
        let out = cp
            .kubectl_stdin(&["apply", "--server-side", "-f", "-"], PROMETHEUS_RULE_CRD)
            .expect("kubectl");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    cp.kubectl_ok(&["wait", "--for=condition=Established", "--timeout=60s", crd])
        .unwrap_or_else(|e| panic!("{e}"));
}

fn kinds(objects: &[Value]) -> BTreeSet<String> {
    objects
        .iter()
        .filter_map(|o| o["kind"].as_str().map(String::from))
        .collect()
}

#[test]
fn metric_names_leave_out_functions_labels_numbers_and_variables() {
    let names = |e: &str| metric_names(e).unwrap_or_else(|err| panic!("{e}: {err}"));
    let set = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    assert_eq!(
        names(
            r#"histogram_quantile(0.99, sum by (namespace, model, le) (rate(a_bucket{stage="end_to_end", model=~"${tenant}"}[$__rate_interval])))"#
        ),
        set(&["a_bucket"])
    );
    assert_eq!(
        names(
            "sum(rate(b_total[5m] offset 1h)) without (pod) / on (tenant) group_left c > bool 1e-3"
        ),
        set(&["b_total", "c"])
    );
    assert_eq!(
        names(r#"count(max by (ns) (d{x="}"}) == 0) or vector(0) and e"#),
        set(&["d", "e"])
    );
    assert!(metric_names("rte(f[5m])").is_err(), "a misspelt function");
    assert!(metric_names(r#"g{x="y"#).is_err(), "an unclosed selector");
    assert_eq!(
        monitoring::variable_metric_names(r#"label_values(h{namespace=~"$namespace"}, tenant)"#),
        Ok(set(&["h"]))
    );
    assert_eq!(
        monitoring::variable_metric_names("label_values(pool)"),
        Ok(set(&[]))
    );

    let text = "# TYPE c counter\nc_total 1\n# TYPE h histogram\n# TYPE g gauge\n# TYPE nv_x unknown\n# HELP ignored help\n# EOF\n";
    assert_eq!(
        exported(text),
        set(&["c_total", "h_bucket", "h_count", "h_sum", "g", "nv_x"])
    );
}

#[test]
#[ignore = "needs the control plane: cargo xtask test"]
fn dashboard_and_alerts_render_only_when_switched_on() {
    let ns = TestNamespace::new("obs-render");
    let cp = ns.control_plane();
    let n = ns.name.as_str();
    let on = [
        "--set",
        "metrics.dashboard.enabled=true",
        "--set",
        "metrics.prometheusRule.enabled=true",
    ];
    let off = render(cp.helm(), n, &PROMETHEUS_RULE_API).expect("render");
    assert!(
        !kinds(&off).contains("PrometheusRule")
            && !off
                .iter()
                .any(|o| o["metadata"]["name"] == format!("{RELEASE}-cotenant-dashboard")),
        "nothing by default: {:?}",
        kinds(&off)
    );
    let without_api = render(cp.helm(), n, &on).expect("render");
    assert!(
        !kinds(&without_api).contains("PrometheusRule"),
        "no PrometheusRule without the monitoring.coreos.com/v1 API"
    );
    assert!(
        without_api
            .iter()
            .any(|o| o["metadata"]["name"] == format!("{RELEASE}-cotenant-dashboard")),
        "the dashboard needs no API but ConfigMaps"
    );
    let mut args = on.to_vec();
    args.extend(PROMETHEUS_RULE_API);
    Monitoring::from_objects(render(cp.helm(), n, &args).expect("render")).expect("both render");

    // The label and namespace the Grafana sidecar looks for are values.
    args.extend([
        "--set",
        "metrics.dashboard.label=dashboards",
        "--set",
        "metrics.dashboard.labelValue=cotenant",
        "--set",
        "metrics.dashboard.namespace=grafana",
    ]);
    let m = Monitoring::from_objects(render(cp.helm(), n, &args).expect("render")).expect("render");
    assert_eq!(m.config_map["metadata"]["labels"]["dashboards"], "cotenant");
    assert_eq!(m.config_map["metadata"]["namespace"], "grafana");
}

#[test]
#[ignore = "needs the control plane: cargo xtask test"]
fn dashboard_and_alerts_are_well_formed_and_the_api_server_accepts_them() {
    let ns = TestNamespace::new("obs");
    let cp = ns.control_plane();
    let n = ns.name.as_str();
    let m = monitoring::render_monitoring(cp.helm(), n).expect("render");

    // The dashboard: the sidecar's label, a data source variable every panel uses, namespace and
    // tenant variables, and a query in every panel.
    assert_eq!(m.config_map["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(m.config_map["metadata"]["namespace"], n);
    let d = &m.dashboard;
    assert_eq!(d["uid"], "cotenant");
    let variables: Vec<&Value> = d["templating"]["list"]
        .as_array()
        .expect("templating.list")
        .iter()
        .collect();
    let variable = |name: &str| {
        variables
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no {name} variable"))
    };
    assert_eq!(variable("datasource")["type"], "datasource");
    assert_eq!(variable("datasource")["query"], "prometheus");
    for name in ["namespace", "tenant"] {
        assert_eq!(variable(name)["type"], "query", "{name}");
        assert_eq!(variable(name)["datasource"]["uid"], "${datasource}");
    }
    let panels = m.panels();
    assert!(panels.len() >= 7, "{} panels", panels.len());
    let mut ids = BTreeSet::new();
    for p in &panels {
        let title = p["title"].as_str().unwrap_or_default();
        assert!(!title.is_empty(), "a panel without a title: {p}");
        assert!(ids.insert(p["id"].to_string()), "{title}: duplicate id");
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{title}");
        let targets = p["targets"].as_array().cloned().unwrap_or_default();
        assert!(!targets.is_empty(), "{title} queries nothing");
        for t in &targets {
            assert!(
                t["expr"].as_str().is_some_and(|e| !e.trim().is_empty()),
                "{title}: a target without a query: {t}"
            );
            assert_eq!(t["datasource"]["uid"], "${datasource}", "{title}");
        }
    }
    let titles: Vec<String> = panels
        .iter()
        .map(|p| p["title"].as_str().unwrap_or_default().to_lowercase())
        .collect();
    for topic in [
        "attainment",
        "p99",
        "shed",
        "knobs",
        "replicas",
        "gpu utilisation",
        "pool size",
    ] {
        assert!(
            titles.iter().any(|t| t.contains(topic)),
            "no panel about {topic}: {titles:?}"
        );
    }

    // The alerts: each described, with a severity, on the operator's gauges.
    let alerts = m.alerts();
    let names: BTreeSet<&str> = alerts.iter().filter_map(|a| a["alert"].as_str()).collect();
    assert_eq!(
        names,
        BTreeSet::from([
            "CotenantAgentsPending",
            "CotenantTenantNotReady",
            "CotenantTenantSLONotMet"
        ])
    );
    for a in &alerts {
        let name = &a["alert"];
        for key in ["summary", "description"] {
            assert!(
                a["annotations"][key]
                    .as_str()
                    .is_some_and(|s| !s.is_empty()),
                "{name}: no {key}"
            );
        }
        assert!(a["labels"]["severity"].is_string(), "{name}: no severity");
        assert!(a["for"].is_string(), "{name}: no for");
    }
    let expr = |alert: &str| {
        alerts
            .iter()
            .find(|a| a["alert"] == alert)
            .and_then(|a| a["expr"].as_str())
            .unwrap_or_default()
            .to_string()
    };
    assert!(expr("CotenantTenantSLONotMet").contains("cotenant_operator_tenant_slo_met"));
    assert!(
        expr("CotenantAgentsPending").contains(r#"cotenant_operator_pool_agents{state="pending"}"#)
    );
    let pending = alerts
        .iter()
        .find(|a| a["alert"] == "CotenantAgentsPending")
        .expect("pending alert");
    assert_eq!(pending["for"], "15m");

    // Every query parses, and names only metrics cotenant exports (the e2e test checks each
    // against a running operator and agent).
    let queried = m.queried_metrics().unwrap_or_else(|e| panic!("{e}"));
    for (metric, places) in &queried {
        assert!(
            ["cotenant_operator_", "cotenant_agent_", "nv_"]
                .iter()
                .any(|p| metric.starts_with(p)),
            "{metric} (in {places:?}) is none of cotenant's metrics"
        );
    }
    eprintln!(
        "observability: {} panels, {} alerts, {} metrics queried",
        panels.len(),
        alerts.len(),
        queried.len()
    );

    // The API server takes both, with every field known to its schema.
    ensure_prometheus_rule_api(cp);
    for object in [&m.config_map, &m.rule] {
        let out = cp
            .kubectl_stdin(
                &[
                    "apply",
                    "--server-side",
                    "--field-manager=cotenant-chart-test",
                    "--validate=strict",
                    "-n",
                    n,
                    "-f",
                    "-",
                ],
                &object.to_string(),
            )
            .expect("kubectl");
        assert!(
            out.status.success(),
            "{} {}: {}",
            object["kind"],
            object["metadata"]["name"],
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let stored = cp
        .kubectl_ok(&[
            "get",
            "configmap",
            &format!("{RELEASE}-cotenant-dashboard"),
            "-n",
            n,
            "-o",
            "json",
        ])
        .expect("the ConfigMap");
    let stored: Value = serde_json::from_str(&stored).expect("json");
    assert_eq!(stored["data"], m.config_map["data"]);
    let stored = cp
        .kubectl_ok(&[
            "get",
            "prometheusrule",
            &format!("{RELEASE}-cotenant-operator"),
            "-n",
            n,
            "-o",
            "json",
        ])
        .expect("the PrometheusRule");
    let stored: Value = serde_json::from_str(&stored).expect("json");
    assert_eq!(
        stored["spec"], m.rule["spec"],
        "the API server kept every field"
    );
}
