//! Certificates and keys for a local control plane: a CA, the API server's serving certificate, an
//! admin client certificate in `system:masters`, and the service-account signing key.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use std::path::{Path, PathBuf};

/// Paths of the PEM files written for one control plane.
#[derive(Debug, Clone)]
pub struct Pki {
    pub ca_cert: PathBuf,
    pub ca_key: PathBuf,
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    pub admin_cert: PathBuf,
    pub admin_key: PathBuf,
    pub sa_key: PathBuf,
    pub sa_pub: PathBuf,
}

/// Writes a fresh PKI into `dir`.
pub fn write(dir: &Path) -> Result<Pki, crate::Error> {
    std::fs::create_dir_all(dir)?;
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name
        .push(DnType::CommonName, "cotenant-local-ca");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca, &ca_key);

    let serving_key = KeyPair::generate()?;
    let mut serving = CertificateParams::new(vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "10.0.0.1".to_string(),
        "kubernetes".to_string(),
        "kubernetes.default".to_string(),
        "kubernetes.default.svc".to_string(),
        "kubernetes.default.svc.cluster.local".to_string(),
    ])?;
    serving
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
    serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let serving_cert = serving.signed_by(&serving_key, &issuer)?;

    let admin_key = KeyPair::generate()?;
    let mut admin = CertificateParams::new(Vec::<String>::new())?;
    admin
        .distinguished_name
        .push(DnType::CommonName, "cotenant-admin");
    admin
        .distinguished_name
        .push(DnType::OrganizationName, "system:masters");
    admin.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let admin_cert = admin.signed_by(&admin_key, &issuer)?;

    let sa_key = KeyPair::generate()?;

    let pki = Pki {
        ca_cert: dir.join("ca.crt"),
        ca_key: dir.join("ca.key"),
        serving_cert: dir.join("apiserver.crt"),
        serving_key: dir.join("apiserver.key"),
        admin_cert: dir.join("admin.crt"),
        admin_key: dir.join("admin.key"),
        sa_key: dir.join("sa.key"),
        sa_pub: dir.join("sa.pub"),
    };
    std::fs::write(&pki.ca_cert, ca_cert.pem())?;
    std::fs::write(&pki.ca_key, ca_key.serialize_pem())?;
    std::fs::write(&pki.serving_cert, serving_cert.pem())?;
    std::fs::write(&pki.serving_key, serving_key.serialize_pem())?;
    std::fs::write(&pki.admin_cert, admin_cert.pem())?;
    std::fs::write(&pki.admin_key, admin_key.serialize_pem())?;
    std::fs::write(&pki.sa_key, sa_key.serialize_pem())?;
    std::fs::write(&pki.sa_pub, sa_key.public_key_pem())?;
    Ok(pki)
}

/// An admin kubeconfig for the API server at `server`, with the certificates inlined by path.
pub fn admin_kubeconfig(pki: &Pki, server: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: cotenant-local
  cluster:
    server: {server}
    certificate-authority: {ca}
users:
- name: cotenant-admin
  user:
    client-certificate: {cert}
    client-key: {key}
contexts:
- name: cotenant-local
  context:
    cluster: cotenant-local
    user: cotenant-admin
    namespace: default
current-context: cotenant-local
",
        ca = pki.ca_cert.display(),
        cert = pki.admin_cert.display(),
        key = pki.admin_key.display(),
    )
}
