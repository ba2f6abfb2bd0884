//! Logs and traces of the cotenant binaries. Logs go to stdout as text or JSON lines, filtered
//! by a `tracing` filter. With an OTLP endpoint, spans (operator rounds, model loads, requests)
//! also go to an OpenTelemetry collector over OTLP/HTTP (protobuf), batched on a background
//! thread; a collector that is down costs dropped spans, never a stalled request.

use anyhow::Context;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, SpanExporter, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

/// How a binary logs and traces.
pub struct Settings<'a> {
    /// The service name spans carry (`cotenant-operator`, `cotenant-agent`).
    pub service: &'static str,
    pub filter: EnvFilter,
    /// JSON lines instead of text.
    pub json: bool,
    /// Colours in text logs.
    pub ansi: bool,
    /// An OTLP/HTTP collector (`http://collector:4318`, or its full `/v1/traces` URL).
    pub otlp_endpoint: Option<&'a str>,
}

/// Flushes the spans not yet exported when dropped; keep it until the process exits.
#[must_use = "dropping the guard stops exporting spans"]
pub struct Guard(Option<SdkTracerProvider>);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(provider) = self.0.take()
            && let Err(e) = provider.shutdown()
        {
            eprintln!("exporting the last spans failed: {e}");
        }
    }
}

/// The URL spans are posted to: `endpoint` as given when it names `/v1/traces`, else that path
/// under it (what `OTEL_EXPORTER_OTLP_ENDPOINT` means).
pub fn traces_url(endpoint: &str) -> String {
    let endpoint = endpoint.trim_end_matches('/');
    if endpoint.ends_with("/v1/traces") {
        endpoint.to_string()
    } else {
        format!("{endpoint}/v1/traces")
    }
}

/// Installs the global subscriber.
pub fn init(settings: Settings) -> anyhow::Result<Guard> {
    let logs: Box<dyn Layer<Registry> + Send + Sync> = if settings.json {
        tracing_subscriber::fmt::layer().json().boxed()
    } else {
        tracing_subscriber::fmt::layer()
            .with_ansi(settings.ansi)
            .boxed()
    };
    let (spans, provider) = match settings.otlp_endpoint {
        None => (None, None),
        Some(endpoint) => {
            let url = traces_url(endpoint);
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                anyhow::bail!("--otlp-endpoint {endpoint:?}: an http:// or https:// URL");
            }
            let exporter = SpanExporter::builder()
                .with_http()
                .with_protocol(Protocol::HttpBinary)
                .with_endpoint(url.clone())
                .build()
                .with_context(|| format!("cannot export spans to {url}"))?;
            let provider = SdkTracerProvider::builder()
                .with_batch_exporter(exporter)
                .with_resource(
                    Resource::builder()
                        .with_service_name(settings.service)
                        .build(),
                )
                .build();
            let tracer = provider.tracer(settings.service);
            (
                Some(tracing_opentelemetry::layer().with_tracer(tracer)),
                Some(provider),
            )
        }
    };
    tracing_subscriber::registry()
        .with(logs)
        .with(spans)
        .with(settings.filter)
        .try_init()
        .context("a logger is already installed")?;
    Ok(Guard(provider))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_traces_path_is_added_once() {
        assert_eq!(traces_url("http://c:4318"), "http://c:4318/v1/traces");
        assert_eq!(traces_url("http://c:4318/"), "http://c:4318/v1/traces");
        assert_eq!(
            traces_url("http://c:4318/v1/traces"),
            "http://c:4318/v1/traces"
        );
    }
}
