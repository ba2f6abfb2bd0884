//! Models in object stores: `s3://<bucket>/<key>`, `gs://<bucket>/<object>` and
//! `az://<container>/<blob>`, through the `object_store` crate.
//!
//! - Settings (credentials, region, endpoint) come only from the keys `cotenant_crds::storage`
//!   lists: in Kubernetes mode from the Secret an assignment names (the operator's copy, in the
//!   agent's namespace), in standalone mode from the agent's environment. Without a credential
//!   the object is read anonymously (unsigned requests): the agent never lends a tenant its own
//!   identity (instance metadata, a workload identity, files in its home).
//! - Every request goes through the agent's checked HTTP client (`download`): the same address
//!   rules hold for an endpoint a tenant's Secret names, IP literals included, and no proxy.
//! - The body streams into the model cache's file, hashed on the way, bounded by
//!   [`MAX_MODEL_BYTES`]; a body that ends before the object's size is an error.

use super::download::{Policy, error_chain, refused_address, transfer_error};
use super::source::MAX_MODEL_BYTES;
use cotenant_crds::storage::{self, Store};
use futures::StreamExt;
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpErrorKind, HttpRequest, HttpResponse, HttpService,
};
use object_store::{BackoffConfig, ClientOptions, ObjectStore, ObjectStoreExt, RetryConfig};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

/// An object store's settings: key (as `cotenant_crds::storage` names it) to value.
pub type Settings = BTreeMap<String, String>;

/// Reads a Secret of the agent's own namespace by name.
#[async_trait::async_trait]
pub trait SecretReader: Send + Sync {
    /// The Secret's data, and how to name it in messages; an error names the Secret and says
    /// what is wrong.
    async fn read(&self, name: &str) -> Result<(String, BTreeMap<String, Vec<u8>>), String>;
}

/// Where an object-store model's settings come from.
#[derive(Clone)]
pub enum Credentials {
    /// Standalone mode: the agent's environment (`AWS_*`, `GOOGLE_*`, `AZURE_*`), for every
    /// tenant.
    Environment,
    /// Kubernetes mode: the Secret an assignment names, read with this (none: no Secret can be
    /// read, and a tenant naming one fails).
    Secrets(Option<Arc<dyn SecretReader>>),
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credentials::Environment => f.write_str("Environment"),
            Credentials::Secrets(r) => write!(f, "Secrets({})", r.is_some()),
        }
    }
}

/// The settings for a model in `store`, from `credentials` and the Secret the model names.
pub async fn settings(
    store: Store,
    secret: Option<&str>,
    credentials: &Credentials,
) -> Result<Settings, String> {
    match (credentials, secret) {
        (Credentials::Environment, _) => from_environment(store, |k| std::env::var_os(k)),
        (Credentials::Secrets(_), None) => Ok(Settings::new()),
        (Credentials::Secrets(None), Some(name)) => Err(format!(
            "this agent cannot read Secrets, so it cannot use credentialsSecret {name:?}"
        )),
        (Credentials::Secrets(Some(reader)), Some(name)) => {
            let (what, data) = reader.read(name).await?;
            storage::settings_from(store, &data, &what)
        }
    }
}

/// The settings for `store` in an environment. A service account key file named by
/// `GOOGLE_APPLICATION_CREDENTIALS` counts as `GOOGLE_SERVICE_ACCOUNT_KEY`.
fn from_environment(
    store: Store,
    var: impl Fn(&str) -> Option<std::ffi::OsString>,
) -> Result<Settings, String> {
    use std::os::unix::ffi::OsStringExt;
    let mut data: BTreeMap<String, Vec<u8>> = store
        .keys()
        .iter()
        .filter_map(|k| Some((k.to_string(), var(k)?.into_vec())))
        .collect();
    if store == Store::Gcs
        && !data.contains_key("GOOGLE_SERVICE_ACCOUNT_KEY")
        && let Some(path) = var("GOOGLE_APPLICATION_CREDENTIALS")
    {
        let path = std::path::PathBuf::from(path);
        let key = super::source::read_regular(&path, storage::MAX_VALUE_BYTES as u64, false)
            .map_err(|e| format!("GOOGLE_APPLICATION_CREDENTIALS: {e}"))?;
        data.insert("GOOGLE_SERVICE_ACCOUNT_KEY".into(), key);
    }
    storage::settings_from(store, &data, "the agent's environment")
}

/// Retries of one request: a couple, quickly, so a broken transfer fails within a minute.
fn retry() -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(2),
            base: 2.0,
        },
        max_retries: 2,
        retry_timeout: Duration::from_secs(60),
    }
}

/// Hands `object_store` the agent's checked client.
#[derive(Debug)]
struct Connector {
    client: reqwest::Client,
    allow_loopback: bool,
}

impl HttpConnector for Connector {
    fn connect(&self, _: &ClientOptions) -> object_store::Result<HttpClient> {
        Ok(HttpClient::new(Checked {
            client: self.client.clone(),
            allow_loopback: self.allow_loopback,
        }))
    }
}

/// The checked client, which also refuses a request to an IP literal models may not come from
/// (names are checked when they resolve).
#[derive(Debug)]
struct Checked {
    client: reqwest::Client,
    allow_loopback: bool,
}

#[async_trait::async_trait]
impl HttpService for Checked {
    async fn call(&self, req: HttpRequest) -> Result<HttpResponse, HttpError> {
        let host = req.uri().host().unwrap_or_default();
        let literal = host.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = literal.parse::<IpAddr>()
            && let Some(why) = refused_address(ip, self.allow_loopback)
        {
            return Err(HttpError::new(
                HttpErrorKind::Connect,
                std::io::Error::other(format!("{ip} is {why}: models may not come from there")),
            ));
        }
        HttpService::call(&self.client, req).await
    }
}

/// An `http://` endpoint needs its store's allow-http setting, as `object_store` has it.
fn check_plain_http(settings: &Settings, endpoint: &str, allow: &str) -> Result<(), String> {
    let endpoint_is_http = settings
        .get(endpoint)
        .is_some_and(|e| e.starts_with("http://"));
    let allowed = settings
        .get(allow)
        .is_some_and(|v| v.eq_ignore_ascii_case("true"));
    if endpoint_is_http && !allowed {
        return Err(format!(
            "{endpoint} is a plain http:// endpoint: set {allow}=true to allow it"
        ));
    }
    Ok(())
}

/// The object store holding `bucket`, configured from `settings` (their keys lowercased are
/// `object_store`'s configuration keys).
fn build(
    store: Store,
    bucket: &str,
    settings: &Settings,
    policy: &Policy,
) -> Result<Arc<dyn ObjectStore>, String> {
    let connector = Connector {
        client: policy.client()?.clone(),
        allow_loopback: policy.allow_loopback,
    };
    let anonymous = !storage::has_credentials(store, settings);
    let config = |k: &str| k.to_ascii_lowercase();
    let bad = |k: &str, e: object_store::Error| format!("{k}: {e}");
    let built: object_store::Result<Arc<dyn ObjectStore>> = match store {
        Store::S3 => {
            check_plain_http(settings, "AWS_ENDPOINT_URL", "AWS_ALLOW_HTTP")?;
            check_plain_http(settings, "AWS_ENDPOINT", "AWS_ALLOW_HTTP")?;
            let mut b = object_store::aws::AmazonS3Builder::new().with_bucket_name(bucket);
            for (k, v) in settings {
                b = b.with_config(config(k).parse().map_err(|e| bad(k, e))?, v);
            }
            b.with_skip_signature(anonymous)
                .with_retry(retry())
                .with_http_connector(connector)
                .build()
                .map(|s| Arc::new(s) as Arc<dyn ObjectStore>)
        }
        Store::Gcs => {
            let mut b =
                object_store::gcp::GoogleCloudStorageBuilder::new().with_bucket_name(bucket);
            for (k, v) in settings {
                b = b.with_config(config(k).parse().map_err(|e| bad(k, e))?, v);
            }
            b.with_skip_signature(anonymous)
                .with_retry(retry())
                .with_http_connector(connector)
                .build()
                .map(|s| Arc::new(s) as Arc<dyn ObjectStore>)
        }
        Store::Azure => {
            check_plain_http(settings, "AZURE_STORAGE_ENDPOINT", "AZURE_ALLOW_HTTP")?;
            let mut b =
                object_store::azure::MicrosoftAzureBuilder::new().with_container_name(bucket);
            for (k, v) in settings {
                b = b.with_config(config(k).parse().map_err(|e| bad(k, e))?, v);
            }
            b.with_skip_signature(anonymous)
                .with_retry(retry())
                .with_http_connector(connector)
                .build()
                .map(|s| Arc::new(s) as Arc<dyn ObjectStore>)
        }
    };
    built.map_err(|e| error_chain(&e))
}

/// Why a request for `uri` failed, in words.
fn describe(uri: &str, e: &object_store::Error, anonymous: bool) -> String {
    match e {
        object_store::Error::NotFound { .. } => format!("{uri}: no such object"),
        object_store::Error::PermissionDenied { .. }
        | object_store::Error::Unauthenticated { .. } => {
            let how = if anonymous {
                "read anonymously (no credentials)"
            } else {
                "with the credentials given"
            };
            format!("{uri}: access denied {how}: {}", error_chain(e))
        }
        _ => format!("{uri}: {}", transfer_error(e)),
    }
}

/// Downloads the object `uri` into `file` with `settings` and returns the SHA-256 of what it
/// wrote. Blocking writes: run it where blocking is allowed.
pub async fn fetch_into(
    uri: &str,
    settings: &Settings,
    policy: &Policy,
    mut file: File,
) -> Result<[u8; 32], String> {
    let (store, bucket, key) = storage::bucket_and_key(uri)
        .ok_or_else(|| format!("{uri}: an object-store URI needs a bucket and a key"))?;
    let path = object_store::path::Path::parse(key)
        .map_err(|e| format!("{uri}: not an object key: {e}"))?;
    let anonymous = !storage::has_credentials(store, settings);
    let objects = build(store, bucket, settings, policy).map_err(|e| format!("{uri}: {e}"))?;
    let got = objects
        .get(&path)
        .await
        .map_err(|e| describe(uri, &e, anonymous))?;
    let expected = got.meta.size;
    if expected > MAX_MODEL_BYTES {
        return Err(format!(
            "{uri}: the model is {expected} bytes, more than the limit of {MAX_MODEL_BYTES}"
        ));
    }
    let mut hasher = Sha256::new();
    let mut size: u64 = 0;
    let mut body = got.into_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| {
            format!(
                "{} (the transfer stopped after {size} of {expected} bytes)",
                describe(uri, &e, anonymous)
            )
        })?;
        size += chunk.len() as u64;
        if size > expected {
            return Err(format!(
                "{uri}: the body is longer than the object's {expected} bytes"
            ));
        }
        hasher.update(&chunk);
        file.write_all(&chunk)
            .map_err(|e| format!("{uri}: cannot write the model cache file: {e}"))?;
    }
    if size != expected {
        return Err(format!(
            "{uri}: truncated: the body ended after {size} of {expected} bytes"
        ));
    }
    Ok(hasher.finalize().into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| {
            pairs
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| OsString::from(v))
        }
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    }

    #[test]
    fn the_environment_gives_only_the_stores_keys() {
        let vars = env(&[
            ("AWS_ACCESS_KEY_ID", "id"),
            ("AWS_SECRET_ACCESS_KEY", "secret"),
            ("AWS_METADATA_ENDPOINT", "http://169.254.169.254"),
            ("HOME", "/root"),
        ]);
        let s3 = from_environment(Store::S3, &vars).expect("s3");
        assert_eq!(
            s3.keys().collect::<Vec<_>>(),
            ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]
        );
        let e = from_environment(Store::S3, env(&[("AWS_ACCESS_KEY_ID", "id")]))
            .expect_err("half a key pair");
        assert!(
            e.starts_with("the agent's environment: ") && e.contains("AWS_SECRET_ACCESS_KEY"),
            "{e}"
        );
        let dir = std::env::temp_dir().join(format!("cotenant-gcs-key-{}", std::process::id()));
        std::fs::write(&dir, b"{\"type\": \"service_account\"}\n").expect("key file");
        let gcs = from_environment(
            Store::Gcs,
            env(&[("GOOGLE_APPLICATION_CREDENTIALS", &dir.to_string_lossy())]),
        )
        .expect("gcs");
        assert_eq!(
            gcs["GOOGLE_SERVICE_ACCOUNT_KEY"],
            "{\"type\": \"service_account\"}"
        );
        let _ = std::fs::remove_file(&dir);
    }

    #[test]
    fn a_secret_is_needed_to_read_one() {
        let rt = runtime();
        let e = rt
            .block_on(settings(
                Store::S3,
                Some("creds"),
                &Credentials::Secrets(None),
            ))
            .expect_err("no reader");
        assert!(e.contains("\"creds\""), "{e}");
        let anonymous = rt
            .block_on(settings(Store::S3, None, &Credentials::Secrets(None)))
            .expect("anonymous");
        assert!(anonymous.is_empty());
    }

    /// Endpoints a tenant's Secret names are held to the download rules: no metadata or
    /// link-local address, no loopback in Kubernetes mode, no plain http without allow-http.
    #[test]
    fn endpoints_from_settings_follow_the_download_rules() {
        let rt = runtime();
        let fetch = |settings: &[(&str, &str)], allow_loopback: bool| {
            let settings: Settings = settings
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            let policy = Policy::new(allow_loopback, Duration::from_secs(5));
            let file = tempfile::tempfile().expect("scratch");
            rt.block_on(fetch_into("s3://bucket/m.onnx", &settings, &policy, file))
        };
        let e = fetch(
            &[
                ("AWS_ENDPOINT_URL", "http://169.254.169.254"),
                ("AWS_ALLOW_HTTP", "true"),
            ],
            true,
        )
        .expect_err("metadata");
        assert!(
            e.starts_with("s3://bucket/m.onnx: ") && e.contains("link-local"),
            "{e}"
        );
        let e = fetch(
            &[
                ("AWS_ENDPOINT_URL", "http://127.0.0.1:9"),
                ("AWS_ALLOW_HTTP", "true"),
            ],
            false,
        )
        .expect_err("loopback");
        assert!(e.contains("loopback"), "{e}");
        let e =
            fetch(&[("AWS_ENDPOINT_URL", "http://models.example")], true).expect_err("plain http");
        assert!(e.contains("AWS_ALLOW_HTTP=true"), "{e}");
    }
}
