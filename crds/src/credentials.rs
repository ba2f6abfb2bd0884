//! Caller tokens as tenants keep them (a Secret's value, or a standalone token file): one token
//! per line. The operator turns them into the SHA-256 digests an assignment carries; the agent
//! compares a caller's token against those.

use sha2::{Digest, Sha256};

/// Fewest characters a token may have: SHA-256 digests of shorter ones could be guessed from
/// the GpuAgent spec they are written into.
pub const MIN_TOKEN_CHARS: usize = 32;

/// Most tokens one tenant accepts at once (the GpuAgent schema's bound).
pub const MAX_TOKENS: usize = 32;

/// Why a set of tokens cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("line {line}: a token needs at least {MIN_TOKEN_CHARS} characters")]
    TooShort { line: usize },
    #[error("line {line}: a token is printable ASCII without spaces")]
    NotPrintable { line: usize },
    #[error("no token in it")]
    Empty,
    #[error("more than {MAX_TOKENS} tokens")]
    TooMany,
}

/// The tokens of a token file or Secret value, one per line (blank lines ignored), checked.
pub fn parse_tokens(text: &str) -> Result<Vec<String>, TokenError> {
    let mut tokens = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let token = line.trim();
        if token.is_empty() {
            continue;
        }
        let line = i + 1;
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(TokenError::NotPrintable { line });
        }
        if token.len() < MIN_TOKEN_CHARS {
            return Err(TokenError::TooShort { line });
        }
        tokens.push(token.to_string());
    }
    if tokens.is_empty() {
        return Err(TokenError::Empty);
    }
    if tokens.len() > MAX_TOKENS {
        return Err(TokenError::TooMany);
    }
    Ok(tokens)
}

/// SHA-256 of a token.
pub fn digest(token: &[u8]) -> [u8; 32] {
    Sha256::digest(token).into()
}

/// Lowercase hex of a digest, as assignments carry it.
pub fn hex(digest: &[u8; 32]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// The digests (lowercase hex) of the tokens in `text`.
pub fn token_digests(text: &str) -> Result<Vec<String>, TokenError> {
    Ok(parse_tokens(text)?
        .iter()
        .map(|t| hex(&digest(t.as_bytes())))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn tokens_are_lines_of_printable_ascii_long_enough() {
        let other = "fedcba9876543210fedcba9876543210";
        assert_eq!(
            parse_tokens(&format!("\n{TOKEN}\r\n  {other}  \n")),
            Ok(vec![TOKEN.to_string(), other.to_string()])
        );
        assert_eq!(parse_tokens("short"), Err(TokenError::TooShort { line: 1 }));
        assert_eq!(
            parse_tokens(&format!("{TOKEN}\nwith space {TOKEN}")),
            Err(TokenError::NotPrintable { line: 2 })
        );
        assert_eq!(parse_tokens("\n \n"), Err(TokenError::Empty));
        let many: String = (0..=MAX_TOKENS).map(|i| format!("{TOKEN}{i}\n")).collect();
        assert_eq!(parse_tokens(&many), Err(TokenError::TooMany));
    }

    #[test]
    fn digests_are_lowercase_hex_sha256() {
        // sha256("abc"), a published test vector.
        assert_eq!(
            hex(&digest(b"abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let digests = token_digests(TOKEN).expect("one token");
        assert_eq!(digests, vec![hex(&digest(TOKEN.as_bytes()))]);
    }
}
