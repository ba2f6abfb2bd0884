//! Per-tenant caller credentials: the SHA-256 digests of the bearer tokens a tenant accepts. In
//! Kubernetes mode the operator resolves them from the tenant's Secret into its assignment; in
//! standalone mode a tenant file names a token file (the format is
//! `cotenant_crds::credentials`). A tenant without any is open to every caller.

use axum::http::{HeaderMap, header};
use cotenant_crds::credentials::{MAX_TOKENS, TokenError, digest, parse_tokens};

pub use cotenant_crds::credentials::hex;

/// Why digests from an assignment cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DigestError {
    #[error("more than {MAX_TOKENS} token digests")]
    TooMany,
    #[error("{0:?} is not a lowercase hex SHA-256 digest")]
    Malformed(String),
}

/// The digests of the tokens a tenant accepts. Empty accepts nobody: that is what a tenant whose
/// credentials cannot be read gets, so it fails closed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TenantTokens {
    digests: Vec<[u8; 32]>,
}

impl TenantTokens {
    /// Nobody may call.
    pub fn deny_all() -> TenantTokens {
        TenantTokens::default()
    }

    /// From the text of a token file or Secret value: one token per line, blank lines ignored.
    pub fn parse(text: &str) -> Result<TenantTokens, TokenError> {
        let digests = parse_tokens(text)?
            .iter()
            .map(|t| digest(t.as_bytes()))
            .collect();
        Ok(TenantTokens { digests })
    }

    /// From lowercase hex digests, as the GpuAgent spec carries them.
    pub fn from_hex(digests: &[String]) -> Result<TenantTokens, DigestError> {
        if digests.len() > MAX_TOKENS {
            return Err(DigestError::TooMany);
        }
        let digests = digests
            .iter()
            .map(|hex| decode_hex(hex).ok_or_else(|| DigestError::Malformed(hex.clone())))
            .collect::<Result<_, _>>()?;
        Ok(TenantTokens { digests })
    }

    /// Whether the request's `Authorization: Bearer <token>` is one of these tokens. Every digest
    /// is compared in full, so the time taken says nothing about which one came close.
    pub fn admit(&self, headers: &HeaderMap) -> bool {
        let Some(token) = bearer(headers) else {
            return false;
        };
        let presented = digest(token.as_bytes());
        self.digests
            .iter()
            .fold(false, |any, d| any | constant_time_eq(d, &presented))
    }
}

/// The bearer token of a request, if it has one.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

fn decode_hex(hex: &str) -> Option<[u8; 32]> {
    let valid = hex.len() == 64
        && hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if !valid {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Compares without leaking where the first difference is.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    const TOKEN: &str = "0123456789abcdef0123456789abcdef";

    fn with_auth(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_str(value).expect("header"),
        );
        headers
    }

    #[test]
    fn only_a_listed_token_is_admitted() {
        let other = "fedcba9876543210fedcba9876543210";
        let tokens = TenantTokens::parse(&format!("\n{TOKEN}\n  {other}  \n")).expect("tokens");
        assert!(tokens.admit(&with_auth(&format!("Bearer {TOKEN}"))));
        assert!(tokens.admit(&with_auth(&format!("bearer {other}"))));
        for refused in [
            format!("Bearer {TOKEN}x"),
            format!("Basic {TOKEN}"),
            "Bearer ".to_string(),
            TOKEN.to_string(),
        ] {
            assert!(!tokens.admit(&with_auth(&refused)), "{refused}");
        }
        assert!(!tokens.admit(&HeaderMap::new()));
        assert!(!TenantTokens::deny_all().admit(&with_auth(&format!("Bearer {TOKEN}"))));
    }

    #[test]
    fn digests_round_trip_through_hex() {
        let hexed = hex(&digest(TOKEN.as_bytes()));
        let tokens = TenantTokens::from_hex(&[hexed]).expect("hex");
        assert!(tokens.admit(&with_auth(&format!("Bearer {TOKEN}"))));
        for bad in ["abc", &"G".repeat(64), &"A".repeat(64)] {
            assert!(TenantTokens::from_hex(&[bad.to_string()]).is_err(), "{bad}");
        }
    }

    #[test]
    fn weak_tokens_are_refused() {
        assert_eq!(
            TenantTokens::parse("short"),
            Err(TokenError::TooShort { line: 1 })
        );
    }
}
