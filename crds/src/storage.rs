//! Object-store model URIs (`s3://`, `gs://`, `az://`) and the settings a model's
//! `credentialsSecret` may hold. The keys are the object store's own environment variable names;
//! only the keys listed here are read: the operator copies no other key of a tenant's Secret to
//! the agents, and the agent (in standalone mode, from its environment) uses no other.

use std::collections::BTreeMap;

/// The object stores a model may come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Store {
    /// `s3://<bucket>/<key>`: Amazon S3 or an S3-compatible server (MinIO, Ceph, ...).
    S3,
    /// `gs://<bucket>/<object>`: Google Cloud Storage.
    Gcs,
    /// `az://<container>/<blob>`: Azure Blob Storage.
    Azure,
}

/// Keys of an `s3://` model's settings: the access key pair (and a session token), the region,
/// and for S3-compatible servers the endpoint, virtual-hosted-style requests (path style is the
/// default) and whether plain `http://` endpoints are allowed.
pub const S3_KEYS: &[&str] = &[
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT",
    "AWS_VIRTUAL_HOSTED_STYLE_REQUEST",
    "AWS_ALLOW_HTTP",
];

/// Keys of a `gs://` model's settings: a service account key (the JSON document itself) or an
/// OAuth bearer token.
pub const GCS_KEYS: &[&str] = &["GOOGLE_SERVICE_ACCOUNT_KEY", "GOOGLE_BEARER_TOKEN"];

/// Keys of an `az://` model's settings: the storage account, and one of its access key, a SAS
/// token, a bearer token or a service principal (client id, secret and tenant); an endpoint for
/// Azure-compatible servers.
pub const AZURE_KEYS: &[&str] = &[
    "AZURE_STORAGE_ACCOUNT_NAME",
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_STORAGE_SAS_KEY",
    "AZURE_STORAGE_SAS_TOKEN",
    "AZURE_STORAGE_TOKEN",
    "AZURE_STORAGE_CLIENT_ID",
    "AZURE_STORAGE_CLIENT_SECRET",
    "AZURE_STORAGE_TENANT_ID",
    "AZURE_STORAGE_ENDPOINT",
    "AZURE_STORAGE_USE_EMULATOR",
    "AZURE_ALLOW_HTTP",
];

/// Label of the operator's copies of tenants' credentialsSecrets in the agents' namespace.
pub const COPY_LABEL: &str = "cotenant.dev/model-credentials";
/// Annotation of such a copy: the tenant's Secret it was copied from, `<namespace>/<name>`.
pub const COPY_SOURCE_ANNOTATION: &str = "cotenant.dev/source-secret";
/// Annotation of such a copy when the tenant's Secret cannot be used: why (the copy then holds
/// no data), so the agent fails the tenant with the reason.
pub const COPY_PROBLEM_ANNOTATION: &str = "cotenant.dev/problem";

/// Longest value of one setting (a service account key is a few KiB).
pub const MAX_VALUE_BYTES: usize = 16 << 10;

impl Store {
    /// The store of an object-store URI, if it is one.
    pub fn of_uri(uri: &str) -> Option<Store> {
        let (scheme, _) = uri.split_once("://")?;
        match scheme {
            "s3" => Some(Store::S3),
            "gs" => Some(Store::Gcs),
            "az" => Some(Store::Azure),
            _ => None,
        }
    }

    /// The URI scheme, with `://`.
    pub fn scheme(self) -> &'static str {
        match self {
            Store::S3 => "s3://",
            Store::Gcs => "gs://",
            Store::Azure => "az://",
        }
    }

    /// The setting keys this store reads.
    pub fn keys(self) -> &'static [&'static str] {
        match self {
            Store::S3 => S3_KEYS,
            Store::Gcs => GCS_KEYS,
            Store::Azure => AZURE_KEYS,
        }
    }
}

/// The bucket (or container) and the object key of an object-store URI.
pub fn bucket_and_key(uri: &str) -> Option<(Store, &str, &str)> {
    let store = Store::of_uri(uri)?;
    let rest = &uri[store.scheme().len()..];
    let (bucket, key) = rest.split_once('/')?;
    let ok = !bucket.is_empty() && !key.is_empty() && !uri.chars().any(char::is_whitespace);
    ok.then_some((store, bucket, key))
}

/// The settings for `store` among `data` (a Secret's data, or the environment): the keys
/// [`Store::keys`] lists, as trimmed UTF-8 text; other keys are left out. `what` names the
/// source in errors.
pub fn settings_from(
    store: Store,
    data: &BTreeMap<String, Vec<u8>>,
    what: &str,
) -> Result<BTreeMap<String, String>, String> {
    let mut settings = BTreeMap::new();
    for key in store.keys() {
        let Some(value) = data.get(*key) else {
            continue;
        };
        if value.len() > MAX_VALUE_BYTES {
            return Err(format!(
                "{what}: {key} is longer than {MAX_VALUE_BYTES} bytes"
            ));
        }
        let text =
            std::str::from_utf8(value).map_err(|_| format!("{what}: {key} is not UTF-8 text"))?;
        settings.insert(key.to_string(), text.trim().to_string());
    }
    check(store, &settings).map_err(|e| format!("{what}: {e}"))?;
    Ok(settings)
}

/// Whether `settings` can work for `store`: keys that only make sense together are together.
/// No credential at all is allowed (the bucket is read anonymously).
pub fn check(store: Store, settings: &BTreeMap<String, String>) -> Result<(), String> {
    let has = |k: &str| settings.get(k).is_some_and(|v| !v.is_empty());
    let together = |keys: &[&str]| -> Result<(), String> {
        let present: Vec<&str> = keys.iter().copied().filter(|k| has(k)).collect();
        if present.is_empty() || present.len() == keys.len() {
            return Ok(());
        }
        let missing: Vec<&str> = keys.iter().copied().filter(|k| !has(k)).collect();
        Err(format!(
            "{} is set but {} is missing",
            present.join(" and "),
            missing.join(" and ")
        ))
    };
    match store {
        Store::S3 => {
            together(&["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"])?;
            if has("AWS_SESSION_TOKEN") && !has("AWS_ACCESS_KEY_ID") {
                return Err(
                    "AWS_SESSION_TOKEN is set but AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are missing"
                        .into(),
                );
            }
        }
        Store::Gcs => {}
        Store::Azure => {
            let emulator = settings
                .get("AZURE_STORAGE_USE_EMULATOR")
                .is_some_and(|v| v.eq_ignore_ascii_case("true"));
            if !has("AZURE_STORAGE_ACCOUNT_NAME") && !emulator {
                return Err("AZURE_STORAGE_ACCOUNT_NAME is missing".into());
            }
            together(&[
                "AZURE_STORAGE_CLIENT_ID",
                "AZURE_STORAGE_CLIENT_SECRET",
                "AZURE_STORAGE_TENANT_ID",
            ])?;
        }
    }
    Ok(())
}

/// Whether `settings` hold a credential for `store` (else the store is read anonymously).
pub fn has_credentials(store: Store, settings: &BTreeMap<String, String>) -> bool {
    let credential_keys: &[&str] = match store {
        Store::S3 => &["AWS_ACCESS_KEY_ID"],
        Store::Gcs => GCS_KEYS,
        Store::Azure => &[
            "AZURE_STORAGE_ACCOUNT_KEY",
            "AZURE_STORAGE_SAS_KEY",
            "AZURE_STORAGE_SAS_TOKEN",
            "AZURE_STORAGE_TOKEN",
            "AZURE_STORAGE_CLIENT_ID",
            "AZURE_STORAGE_USE_EMULATOR",
        ],
    };
    credential_keys
        .iter()
        .any(|k| settings.get(*k).is_some_and(|v| !v.is_empty()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, Vec<u8>> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
            .collect()
    }

    #[test]
    fn uris_split_into_store_bucket_and_key() {
        assert_eq!(
            bucket_and_key("s3://models/resnet/m.onnx"),
            Some((Store::S3, "models", "resnet/m.onnx"))
        );
        assert_eq!(
            bucket_and_key("gs://b/m.onnx"),
            Some((Store::Gcs, "b", "m.onnx"))
        );
        assert_eq!(
            bucket_and_key("az://c/m.onnx"),
            Some((Store::Azure, "c", "m.onnx"))
        );
        for bad in [
            "s3://bucket",
            "s3://bucket/",
            "s3:///key",
            "ftp://b/k",
            "s3://b/a b",
        ] {
            assert_eq!(bucket_and_key(bad), None, "{bad}");
        }
    }

    #[test]
    fn only_the_stores_keys_are_taken_trimmed() {
        let secret = data(&[
            ("AWS_ACCESS_KEY_ID", "id\n"),
            ("AWS_SECRET_ACCESS_KEY", " secret "),
            ("AWS_ENDPOINT_URL", "http://minio:9000"),
            ("AWS_METADATA_ENDPOINT", "http://169.254.169.254"),
            ("password", "unrelated"),
        ]);
        let settings = settings_from(Store::S3, &secret, "Secret t/s").expect("usable");
        assert_eq!(
            settings.keys().collect::<Vec<_>>(),
            [
                "AWS_ACCESS_KEY_ID",
                "AWS_ENDPOINT_URL",
                "AWS_SECRET_ACCESS_KEY"
            ]
        );
        assert_eq!(settings["AWS_ACCESS_KEY_ID"], "id");
        assert!(has_credentials(Store::S3, &settings));
        // Another store's keys are not this one's.
        let gcs = settings_from(Store::Gcs, &secret, "Secret t/s").expect("anonymous");
        assert!(gcs.is_empty() && !has_credentials(Store::Gcs, &gcs));
    }

    #[test]
    fn incomplete_credentials_name_what_is_missing() {
        let e = settings_from(
            Store::S3,
            &data(&[("AWS_ACCESS_KEY_ID", "id")]),
            "Secret t/s",
        )
        .expect_err("no secret key");
        assert!(
            e.starts_with("Secret t/s: ") && e.contains("AWS_SECRET_ACCESS_KEY is missing"),
            "{e}"
        );
        let e = settings_from(Store::S3, &data(&[("AWS_SESSION_TOKEN", "t")]), "x")
            .expect_err("token alone");
        assert!(e.contains("AWS_SESSION_TOKEN"), "{e}");
        let e = settings_from(
            Store::Azure,
            &data(&[("AZURE_STORAGE_ACCOUNT_KEY", "k")]),
            "x",
        )
        .expect_err("no account");
        assert!(e.contains("AZURE_STORAGE_ACCOUNT_NAME is missing"), "{e}");
        let e = settings_from(Store::S3, &data(&[("AWS_REGION", "\u{0}")]), "x");
        assert!(e.is_ok(), "text is text");
        let binary = BTreeMap::from([("AWS_REGION".to_string(), vec![0xff, 0xfe])]);
        let e = settings_from(Store::S3, &binary, "x").expect_err("binary");
        assert!(e.contains("AWS_REGION is not UTF-8"), "{e}");
    }
}
