//! The listener's optional bearer token (RFC 6750): when the server has one, every endpoint
//! but `/healthz` answers only requests with `Authorization: Bearer TOKEN`.
//!
//! Promises:
//! * A token is read from a file of at most [`MAX_TOKEN_FILE`] bytes; trailing whitespace (the
//!   newline an editor adds) is not part of it; an empty token or one with characters a
//!   header cannot carry (RFC 6750's `b64token`: letters, digits, `-._~+/`, trailing `=`) is
//!   an error.
//! * The token is compared in constant time ([`subtle`]) and never shown by `Debug`.

use std::io::{Error, ErrorKind, Read};
use std::path::Path;
use subtle::ConstantTimeEq;

/// The largest token file read.
pub const MAX_TOKEN_FILE: usize = 4096;

/// A secret a request must present.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(***)")
    }
}

impl Token {
    /// A token from its text.
    pub fn new(text: &str) -> Result<Token, String> {
        if text.is_empty() {
            return Err("the token is empty".into());
        }
        let body = text.trim_end_matches('=');
        let ok = !body.is_empty()
            && body
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-._~+/".contains(&b));
        if !ok {
            return Err(
                "the token may hold only letters, digits and -._~+/ (and = at its end)".into(),
            );
        }
        Ok(Token(text.to_owned()))
    }

    /// The token in file `path` (trailing whitespace left out).
    pub fn read(path: &Path) -> std::io::Result<Token> {
        let mut text = String::new();
        std::fs::File::open(path)?
            .take(MAX_TOKEN_FILE as u64 + 1)
            .read_to_string(&mut text)
            .map_err(|e| Error::new(ErrorKind::InvalidData, e))?;
        if text.len() > MAX_TOKEN_FILE {
            return Err(Error::new(
                ErrorKind::InvalidData,
                format!("longer than {MAX_TOKEN_FILE} bytes"),
            ));
        }
        Token::new(text.trim_end()).map_err(|e| Error::new(ErrorKind::InvalidData, e))
    }

    /// Whether `presented` is this token; the time taken does not depend on where they
    /// differ.
    pub fn matches(&self, presented: &str) -> bool {
        self.0.as_bytes().ct_eq(presented.as_bytes()).into()
    }

    /// The `Authorization` header's value that presents this token.
    pub fn authorization(&self) -> String {
        format!("Bearer {}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_and_their_files() {
        let t = Token::new("s3cr3t-Token_1==").unwrap();
        assert!(t.matches("s3cr3t-Token_1=="));
        assert!(!t.matches("s3cr3t-Token_1="));
        assert!(!t.matches(""));
        assert_eq!(format!("{t:?}"), "Token(***)");
        for bad in ["", "a b", "==", "tök", "a\nb", "a=b"] {
            assert!(Token::new(bad).is_err(), "{bad:?}");
        }
        let dir = std::env::temp_dir().join(format!("flowstate-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("token");
        std::fs::write(&f, "abc123\n").unwrap();
        assert!(Token::read(&f).unwrap().matches("abc123"));
        std::fs::write(&f, "\n").unwrap();
        assert_eq!(Token::read(&f).unwrap_err().kind(), ErrorKind::InvalidData);
        std::fs::write(&f, "a".repeat(MAX_TOKEN_FILE + 1)).unwrap();
        assert!(Token::read(&f).unwrap_err().to_string().contains("longer"));
        std::fs::write(&f, [0xffu8, 0xfe]).unwrap();
        assert!(Token::read(&f).is_err());
        assert!(Token::read(&dir.join("missing")).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
