//! What the chart's Grafana dashboard and alerts query, and what a `/metrics` page exports: the
//! control-plane test renders and applies them, the e2e test compares them with what the running
//! operator and agents export. Included by both test binaries (`#[path]`).

use cotenant_e2e::TestNamespace;
use cotenant_e2e::cluster::checked;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

/// The release name the chart is rendered as.
pub const RELEASE: &str = "obs";

/// `--api-versions` that make the chart render its PrometheusRule.
pub const PROMETHEUS_RULE_API: [&str; 2] =
    ["--api-versions", "monitoring.coreos.com/v1/PrometheusRule"];

/// `helm template` of the chart into `namespace` with `args` added, as JSON objects.
pub fn render(mut helm: Command, namespace: &str, args: &[&str]) -> Result<Vec<Value>, String> {
    let chart = TestNamespace::repo_root().join("charts/cotenant");
    helm.args(["template", RELEASE])
        .arg(&chart)
        .args(["-n", namespace])
        .args(args);
    let out = checked(helm.output(), "helm template").map_err(|e| e.to_string())?;
    let mut objects = Vec::new();
    let mut doc = String::new();
    for line in out.lines().chain(["---"]) {
        if line == "---" {
            let object: Value = serde_yaml::from_str(&doc).map_err(|e| format!("{e}:\n{doc}"))?;
            if !object.is_null() {
                objects.push(object);
            }
            doc.clear();
        } else {
            doc.push_str(line);
            doc.push('\n');
        }
    }
    Ok(objects)
}

/// `helm template` with the dashboard and the alerts switched on and the PrometheusRule API
/// present.
pub fn render_monitoring(helm: Command, namespace: &str) -> Result<Monitoring, String> {
    let mut args = vec![
        "--set",
        "metrics.dashboard.enabled=true",
        "--set",
        "metrics.prometheusRule.enabled=true",
    ];
    args.extend(PROMETHEUS_RULE_API);
    Monitoring::from_objects(render(helm, namespace, &args)?)
}

/// A PromQL expression and where it is.
#[derive(Debug, Clone)]
pub struct Query {
    pub place: String,
    pub expr: String,
    /// A Grafana template variable's query (`label_values(...)`), not plain PromQL.
    pub variable: bool,
}

/// The chart's dashboard and alerts as rendered.
#[derive(Debug)]
pub struct Monitoring {
    pub config_map: Value,
    pub dashboard: Value,
    pub rule: Value,
}

impl Monitoring {
    /// Finds the dashboard's ConfigMap and the PrometheusRule among rendered `objects`.
    pub fn from_objects(objects: Vec<Value>) -> Result<Monitoring, String> {
        let find = |kind: &str, name: &str| {
            objects
                .iter()
                .find(|o| o["kind"] == kind && o["metadata"]["name"].as_str() == Some(name))
                .cloned()
                .ok_or_else(|| format!("no {kind} {name} rendered"))
        };
        let config_map = find("ConfigMap", &format!("{RELEASE}-cotenant-dashboard"))?;
        let rule = find("PrometheusRule", &format!("{RELEASE}-cotenant-operator"))?;
        let json = config_map["data"]["cotenant.json"]
            .as_str()
            .ok_or("the ConfigMap has no data.cotenant.json")?;
        let dashboard = serde_json::from_str(json)
            .map_err(|e| format!("the dashboard is not well-formed JSON: {e}"))?;
        Ok(Monitoring {
            config_map,
            dashboard,
            rule,
        })
    }

    /// The dashboard's panels, those inside rows included (rows themselves left out).
    pub fn panels(&self) -> Vec<&Value> {
        fn walk<'a>(panels: &'a Value, out: &mut Vec<&'a Value>) {
            for p in panels.as_array().into_iter().flatten() {
                if p["type"] == "row" {
                    walk(&p["panels"], out);
                } else {
                    out.push(p);
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.dashboard["panels"], &mut out);
        out
    }

    /// The alerting rules of every group.
    pub fn alerts(&self) -> Vec<&Value> {
        let groups = self.rule["spec"]["groups"].as_array().into_iter().flatten();
        groups
            .flat_map(|g| g["rules"].as_array().into_iter().flatten())
            .collect()
    }

    /// Every query: each panel target's, each template variable's, each alert's.
    pub fn queries(&self) -> Vec<Query> {
        let mut out = Vec::new();
        for p in self.panels() {
            for t in p["targets"].as_array().into_iter().flatten() {
                out.push(Query {
                    place: format!("panel {:?} {}", p["title"], t["refId"]),
                    expr: t["expr"].as_str().unwrap_or_default().to_string(),
                    variable: false,
                });
            }
        }
        let variables = self.dashboard["templating"]["list"].as_array();
        for v in variables
            .into_iter()
            .flatten()
            .filter(|v| v["type"] == "query")
        {
            let query = &v["query"];
            let expr = query.as_str().or_else(|| query["query"].as_str());
            out.push(Query {
                place: format!("variable {}", v["name"]),
                expr: expr.unwrap_or_default().to_string(),
                variable: true,
            });
        }
        for a in self.alerts() {
            out.push(Query {
                place: format!("alert {}", a["alert"]),
                expr: a["expr"].as_str().unwrap_or_default().to_string(),
                variable: false,
            });
        }
        out
    }

    /// Every metric any query names, with the places that name it.
    pub fn queried_metrics(&self) -> Result<BTreeMap<String, BTreeSet<String>>, String> {
        let mut metrics: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for q in self.queries() {
            let names = if q.variable {
                variable_metric_names(&q.expr)
            } else {
                metric_names(&q.expr)
            }
            .map_err(|e| format!("{}: {e} in {:?}", q.place, q.expr))?;
            for name in names {
                metrics.entry(name).or_default().insert(q.place.clone());
            }
        }
        Ok(metrics)
    }
}

/// PromQL's aggregation operators and functions: an identifier followed by `(` must be one.
const FUNCTIONS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
    "abs",
    "absent",
    "absent_over_time",
    "ceil",
    "changes",
    "clamp",
    "clamp_max",
    "clamp_min",
    "day_of_month",
    "day_of_week",
    "day_of_year",
    "days_in_month",
    "delta",
    "deriv",
    "exp",
    "floor",
    "histogram_avg",
    "histogram_count",
    "histogram_fraction",
    "histogram_quantile",
    "histogram_stddev",
    "histogram_stdvar",
    "histogram_sum",
    "double_exponential_smoothing",
    "holt_winters",
    "hour",
    "idelta",
    "increase",
    "info",
    "irate",
    "label_join",
    "label_replace",
    "ln",
    "log2",
    "log10",
    "minute",
    "month",
    "predict_linear",
    "rate",
    "resets",
    "round",
    "scalar",
    "sgn",
    "sort",
    "sort_desc",
    "sort_by_label",
    "sort_by_label_desc",
    "sqrt",
    "time",
    "timestamp",
    "vector",
    "year",
    "avg_over_time",
    "min_over_time",
    "max_over_time",
    "sum_over_time",
    "count_over_time",
    "quantile_over_time",
    "stddev_over_time",
    "stdvar_over_time",
    "last_over_time",
    "present_over_time",
    "mad_over_time",
    "acos",
    "acosh",
    "asin",
    "asinh",
    "atan",
    "atanh",
    "cos",
    "cosh",
    "sin",
    "sinh",
    "tan",
    "tanh",
    "deg",
    "rad",
    "pi",
    "start",
    "end",
];

/// Keywords followed by a list of label names: `by (le)`, `on (tenant)`, `group_left (pool)`.
const GROUPING: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// Binary operators and literals spelled as words.
const KEYWORDS: &[&str] = &[
    "and", "or", "unless", "bool", "offset", "atan2", "inf", "nan",
];

fn identifier_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn identifier_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// The index just past the string literal that opens at `i`.
fn skip_string(chars: &[char], i: usize) -> Result<usize, String> {
    let quote = chars[i];
    let mut j = i + 1;
    while j < chars.len() {
        match chars[j] {
            '\\' if quote != '`' => j += 2,
            c if c == quote => return Ok(j + 1),
            _ => j += 1,
        }
    }
    Err("an unterminated string".into())
}

/// The index just past the bracket that closes the one opening at `i` (strings inside skipped).
fn skip_block(chars: &[char], i: usize) -> Result<usize, String> {
    let (open, close) = match chars[i] {
        '{' => ('{', '}'),
        '[' => ('[', ']'),
        _ => ('(', ')'),
    };
    let mut depth = 0;
    let mut j = i;
    while j < chars.len() {
        match chars[j] {
            '"' | '\'' | '`' => {
                j = skip_string(chars, j)?;
                continue;
            }
            c if c == open => depth += 1,
            c if c == close => {
                depth -= 1;
                if depth == 0 {
                    return Ok(j + 1);
                }
            }
            _ => {}
        }
        j += 1;
    }
    Err(format!("an unclosed {open:?}"))
}

/// The metric names a PromQL expression selects: every identifier that is not a function, an
/// aggregation, a keyword, a label (inside `{...}` or a `by (...)` list), a number or duration,
/// or a Grafana variable (`$__rate_interval`, `${tenant}`). An identifier called like a function
/// must be one of PromQL's.
pub fn metric_names(expr: &str) -> Result<BTreeSet<String>, String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if matches!(c, '"' | '\'' | '`') {
            i = skip_string(&chars, i)?;
        } else if matches!(c, '{' | '[') {
            i = skip_block(&chars, i)?;
        } else if c == '#' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '$' {
            i += 1;
            if chars.get(i) == Some(&'{') {
                i = skip_block(&chars, i)?;
            } else {
                while i < chars.len() && identifier_char(chars[i]) {
                    i += 1;
                }
            }
        } else if c.is_ascii_digit()
            || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit))
        {
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '.' || chars[i] == '_')
            {
                i += 1;
            }
        } else if identifier_start(c) {
            let start = i;
            while i < chars.len() && identifier_char(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let mut next = i;
            while next < chars.len() && chars[next].is_whitespace() {
                next += 1;
            }
            let called = chars.get(next) == Some(&'(');
            if GROUPING.contains(&word.as_str()) {
                if called {
                    i = skip_block(&chars, next)?;
                }
            } else if FUNCTIONS.contains(&word.as_str()) {
                // An aggregation may put its `by (...)` first: `sum by (le) (...)`.
            } else if called {
                return Err(format!("{word}() is no PromQL function"));
            } else if !KEYWORDS.contains(&word.as_str()) {
                names.insert(word);
            }
        } else {
            i += 1;
        }
    }
    Ok(names)
}

/// The metric a Grafana template variable's query reads: `label_values(<selector>, <label>)`,
/// `query_result(<PromQL>)`, or none (`label_values(<label>)`, `label_names()`, `metrics(...)`).
pub fn variable_metric_names(query: &str) -> Result<BTreeSet<String>, String> {
    let query = query.trim();
    let inner = |prefix: &str| {
        query
            .strip_prefix(prefix)
            .and_then(|rest| rest.trim_start().strip_prefix('('))
            .and_then(|rest| rest.trim_end().strip_suffix(')'))
    };
    if let Some(args) = inner("label_values") {
        // The selector is everything before the last comma outside braces and strings.
        let chars: Vec<char> = args.chars().collect();
        let mut last_comma = None;
        let mut i = 0;
        while i < chars.len() {
            match chars[i] {
                '"' | '\'' | '`' => i = skip_string(&chars, i)?,
                '{' | '[' | '(' => i = skip_block(&chars, i)?,
                ',' => {
                    last_comma = Some(i);
                    i += 1;
                }
                _ => i += 1,
            }
        }
        return match last_comma {
            Some(at) => metric_names(&chars[..at].iter().collect::<String>()),
            None => Ok(BTreeSet::new()),
        };
    }
    if let Some(expr) = inner("query_result") {
        return metric_names(expr);
    }
    if inner("label_names").is_some() || inner("metrics").is_some() {
        return Ok(BTreeSet::new());
    }
    Err("not a Grafana Prometheus variable query".into())
}

/// The series names a `/metrics` page exports, from its `# TYPE` lines: a counter is stored as
/// `<name>_total`, a histogram as `_bucket`, `_sum` and `_count`, a summary as itself, `_sum` and
/// `_count`, an info as `_info`; gauges and untyped metrics under their own name.
pub fn exported(exposition: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in exposition.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut words = rest.split_whitespace();
        let (Some(name), Some(kind)) = (words.next(), words.next()) else {
            continue;
        };
        match kind {
            "counter" if name.ends_with("_total") => {
                names.insert(name.to_string());
            }
            "counter" => {
                names.insert(format!("{name}_total"));
            }
            "histogram" => {
                for suffix in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{name}{suffix}"));
                }
            }
            "summary" => {
                for suffix in ["", "_sum", "_count"] {
                    names.insert(format!("{name}{suffix}"));
                }
            }
            "info" => {
                names.insert(format!("{name}_info"));
            }
            _ => {
                names.insert(name.to_string());
            }
        }
    }
    names
}
