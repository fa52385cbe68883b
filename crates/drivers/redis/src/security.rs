//! Credentials and TLS of the Redis connections: the `[state]` keys `password_file`,
//! `ca_file`, `cert_file`, `key_file` and `tls_skip_verify`, read once into a [`Security`]
//! that opens every connection (each node of a cluster alike), and the start-up check's
//! classification of a failed connection into the key that is wrong.

use crate::Setting;
use flowstate_state::{BackendError, SettingError};
use redis::{ConnectionAddr, ConnectionInfo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The keys this module reads, for "unknown key" messages.
pub(crate) const KEYS: &str = "password_file, ca_file, cert_file, key_file and tls_skip_verify";

/// The keys as given (paths not read yet).
#[derive(Default)]
pub(crate) struct Keys {
    password_file: Option<String>,
    ca_file: Option<String>,
    cert_file: Option<String>,
    key_file: Option<String>,
    skip_verify: bool,
}

impl Keys {
    /// Takes `key` if it is one of ours; `Ok(false)` if it is not.
    pub(crate) fn take(&mut self, key: &str, value: Setting<'_>) -> Result<bool, SettingError> {
        let path = |v: Setting<'_>| match v {
            Setting::Str(s) if !s.trim().is_empty() => Ok(s.to_owned()),
            _ => Err(SettingError::new(key, "expected the path of a file")),
        };
        match key {
            "password_file" => self.password_file = Some(path(value)?),
            "ca_file" => self.ca_file = Some(path(value)?),
            "cert_file" => self.cert_file = Some(path(value)?),
            "key_file" => self.key_file = Some(path(value)?),
            "tls_skip_verify" => match value {
                Setting::Bool(b) => self.skip_verify = b,
                _ => return Err(SettingError::new(key, "expected true or false")),
            },
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Reads the files and puts the password into every address of `infos`; the address key
    /// (`url` or `nodes`) names conflicts with the addresses.
    pub(crate) fn apply(
        self,
        infos: &mut [ConnectionInfo],
        address_key: &str,
    ) -> Result<Security, SettingError> {
        let tls = infos.first().is_some_and(is_tls);
        if !tls {
            let given = [
                ("ca_file", self.ca_file.is_some()),
                ("cert_file", self.cert_file.is_some()),
                ("key_file", self.key_file.is_some()),
                ("tls_skip_verify", self.skip_verify),
            ];
            if let Some((key, _)) = given.iter().find(|(_, set)| *set) {
                return Err(SettingError::new(
                    *key,
                    format!("a TLS setting, but {address_key} is not a rediss:// address"),
                ));
            }
        }
        let client = match (&self.cert_file, &self.key_file) {
            (Some(c), Some(k)) => Some((read_certs("cert_file", c)?, read_key("key_file", k)?)),
            (None, None) => None,
            (Some(_), None) => {
                return Err(SettingError::new(
                    "key_file",
                    "missing: cert_file needs the key of its certificate",
                ))
            }
            (None, Some(_)) => {
                return Err(SettingError::new(
                    "cert_file",
                    "missing: key_file needs the certificate it is the key of",
                ))
            }
        };
        let ca = match &self.ca_file {
            Some(p) => Some(read_certs("ca_file", p)?),
            None => None,
        };
        if let Some(p) = &self.password_file {
            let password = read_password(p)?;
            if infos
                .iter()
                .any(|i| i.redis_settings().password().is_some())
            {
                return Err(SettingError::new(
                    "password_file",
                    format!("{address_key} has a password already: give it in one place"),
                ));
            }
            for info in infos.iter_mut() {
                let settings = info.redis_settings().clone().set_password(&password);
                *info = info.clone().set_redis_settings(settings);
            }
        }
        Ok(Security {
            tls,
            ca,
            client,
            skip_verify: self.skip_verify,
            password_file: self.password_file.is_some(),
        })
    }
}

fn read(key: &str, path: &str) -> Result<Vec<u8>, SettingError> {
    std::fs::read(path).map_err(|e| SettingError::new(key, format!("{path}: {e}")))
}

/// A PEM file with at least one certificate, as read.
fn read_certs(key: &str, path: &str) -> Result<Vec<u8>, SettingError> {
    let pem = read(key, path)?;
    let certs: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(&pem).collect();
    match certs {
        Ok(c) if !c.is_empty() => Ok(pem),
        Ok(_) => Err(SettingError::new(
            key,
            format!("{path}: no PEM certificate (-----BEGIN CERTIFICATE-----) in it"),
        )),
        Err(e) => Err(SettingError::new(
            key,
            format!("{path}: not a PEM certificate file: {e}"),
        )),
    }
}

/// A PEM file with a private key, as read.
fn read_key(key: &str, path: &str) -> Result<Vec<u8>, SettingError> {
    let pem = read(key, path)?;
    PrivateKeyDer::from_pem_slice(&pem)
        .map_err(|e| SettingError::new(key, format!("{path}: no PEM private key in it: {e}")))?;
    Ok(pem)
}

/// The first line of a password file.
fn read_password(path: &str) -> Result<String, SettingError> {
    let text = flowstate_config::read_text(path)
        .map_err(|e| SettingError::new("password_file", format!("{path}: {e}")))?;
    let line = text.lines().next().unwrap_or_default();
    if line.is_empty() {
        return Err(SettingError::new(
            "password_file",
            format!("{path}: empty (the password is its first line)"),
        ));
    }
    Ok(line.to_owned())
}

pub(crate) fn is_tls(info: &ConnectionInfo) -> bool {
    matches!(info.addr(), ConnectionAddr::TcpTls { .. })
}

/// `url` (or a comma-separated list of them) without its passwords, for messages.
pub(crate) fn redact(url: &str) -> String {
    if url.contains(',') {
        return url.split(',').map(redact).collect::<Vec<_>>().join(",");
    }
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let userinfo = &url[s + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..s + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

/// How connections are opened: TLS (with the files' contents) or not.
#[derive(Clone, Default)]
pub(crate) struct Security {
    /// `rediss://`.
    pub(crate) tls: bool,
    ca: Option<Vec<u8>>,
    client: Option<(Vec<u8>, Vec<u8>)>,
    skip_verify: bool,
    /// Whether the password came from `password_file` (the key a refusal names).
    password_file: bool,
}

impl std::fmt::Debug for Security {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Security")
            .field("tls", &self.tls)
            .field("ca_file", &self.ca.is_some())
            .field("client_cert", &self.client.is_some())
            .field("skip_verify", &self.skip_verify)
            .finish()
    }
}

/// Why a connection could not be opened.
#[derive(Debug)]
pub(crate) enum OpenError {
    /// The server refused the user or password.
    Auth(String),
    /// The TLS handshake failed: the server's certificate (`client_side: false`) or ours.
    Tls { client_side: bool, reason: String },
    /// Anything else: not reached, timed out, closed.
    Other(String),
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpenError::Auth(m) | OpenError::Other(m) | OpenError::Tls { reason: m, .. } => {
                f.write_str(m)
            }
        }
    }
}

impl OpenError {
    /// Classifies the client's error on opening a connection to `info`.
    pub(crate) fn new(info: &ConnectionInfo, e: redis::RedisError) -> OpenError {
        let text = e.to_string();
        let at = |m: &str| format!("{}: {m}", addr_text(info.addr()));
        let auth = e.kind() == redis::ErrorKind::AuthenticationFailed
            || [
                "WRONGPASS",
                "NOAUTH",
                "invalid password",
                "invalid username-password",
            ]
            .iter()
            .any(|w| text.contains(w));
        if auth {
            return OpenError::Auth(at(&text));
        }
        if text.contains("invalid peer certificate") || text.contains("CertificateUnknown") {
            return OpenError::Tls {
                client_side: false,
                reason: at(&text),
            };
        }
        let client_refused = [
            "CertificateRequired",
            "BadCertificate",
            "UnknownCA",
            "UnsupportedCertificate",
            "DecryptError",
        ];
        if text.contains("alert") && client_refused.iter().any(|w| text.contains(w)) {
            return OpenError::Tls {
                client_side: true,
                reason: at(&text),
            };
        }
        OpenError::Other(at(&text))
    }

    /// As the runtime's error: a connection that cannot be opened is unreachable for now.
    pub(crate) fn into_backend(self, backend: &'static str) -> BackendError {
        BackendError::Unreachable {
            backend,
            reason: self.to_string(),
        }
    }
}

fn addr_text(a: &ConnectionAddr) -> String {
    match a {
        ConnectionAddr::Tcp(h, p)
        | ConnectionAddr::TcpTls {
            host: h, port: p, ..
        } => {
            format!("{h}:{p}")
        }
        other => other.to_string(),
    }
}

impl Security {
    /// Plain or TLS as `info`'s scheme says, nothing else set.
    pub(crate) fn for_url(info: &ConnectionInfo) -> Security {
        Security {
            tls: is_tls(info),
            ..Security::default()
        }
    }

    /// A client for `info` with these TLS settings.
    pub(crate) fn client(&self, info: &ConnectionInfo) -> Result<redis::Client, OpenError> {
        let other = |e: redis::RedisError| OpenError::Other(e.to_string());
        if !self.tls {
            return redis::Client::open(info.clone()).map_err(other);
        }
        install_crypto_provider();
        let mut info = info.clone();
        if self.skip_verify {
            if let ConnectionAddr::TcpTls { host, port, .. } = info.addr().clone() {
                info = info.set_addr(ConnectionAddr::TcpTls {
                    host,
                    port,
                    insecure: true,
                    tls_params: None,
                });
            }
        }
        let certs = redis::TlsCertificates {
            client_tls: self.client.as_ref().map(|(c, k)| redis::ClientTlsConfig {
                client_cert: c.clone(),
                client_key: k.clone(),
            }),
            root_cert: self.ca.clone(),
        };
        redis::Client::build_with_tls(info, certs).map_err(other)
    }

    /// The `[state]` key a failed start-up connection points at, with what happened.
    pub(crate) fn explain(&self, e: OpenError, address_key: &str) -> SettingError {
        match e {
            OpenError::Auth(m) => {
                let key = if self.password_file {
                    "password_file"
                } else {
                    address_key
                };
                SettingError::new(
                    key,
                    format!("the server refused the user or password ({m})"),
                )
            }
            OpenError::Tls {
                client_side: false,
                reason,
            } => SettingError::new(
                "ca_file",
                format!(
                    "the server's certificate is not trusted ({reason}){}",
                    if self.ca.is_some() {
                        ": ca_file must hold the CA that signed it"
                    } else {
                        ": give its CA in ca_file"
                    }
                ),
            ),
            OpenError::Tls {
                client_side: true,
                reason,
            } => SettingError::new(
                "cert_file",
                format!(
                    "the server refused the TLS handshake ({reason}){}",
                    if self.client.is_some() {
                        ": it does not trust this client certificate"
                    } else {
                        ": it wants a client certificate (cert_file and key_file)"
                    }
                ),
            ),
            OpenError::Other(m) => {
                // A TLS server closes a plain client's connection at its first bytes.
                let hint = if !self.tls && (m.contains("reset") || m.contains("closed")) {
                    " (a TLS server? its address is rediss://)"
                } else {
                    ""
                };
                SettingError::new(
                    address_key,
                    format!("the store does not answer at start-up: {m}{hint}"),
                )
            }
        }
    }
}

/// rustls needs one process-wide crypto provider: `ring` unless one was installed before.
fn install_crypto_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact("rediss://u:secret@h:1/0"),
            "rediss://u:***@h:1/0".to_owned()
        );
        assert_eq!(redact("redis://:pw@h:1"), "redis://:***@h:1".to_owned());
        assert_eq!(redact("redis://h:1"), "redis://h:1".to_owned());
        assert_eq!(
            redact("rediss://u:a@h:1, rediss://u:b@h:2"),
            "rediss://u:***@h:1, rediss://u:***@h:2".to_owned()
        );
    }
}
