//! The driver's settings, read from `[state]` (`url` and the keys in
//! `StateSection::options`).

use flowstate_state::SettingError;
use scylla::frame::types::Consistency;
use std::path::PathBuf;
use std::time::Duration;

/// The default contact point.
pub const DEFAULT_NODE: &str = "127.0.0.1:9042";

/// Keys of `[state]` this driver reads besides `url`.
pub const KEYS: &[&str] = &[
    "nodes",
    "replication_factor",
    "consistency",
    "username",
    "password",
    "password_file",
    "ca_file",
];

pub use flowstate_config::Secret;

/// How to reach a Cassandra cluster and how to store state in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CassandraConfig {
    /// Contact points, `host:port` (the driver discovers the rest of the cluster).
    pub nodes: Vec<String>,
    /// Replication factor of the keyspaces the driver creates (`SimpleStrategy`).
    pub replication_factor: u32,
    /// Consistency level of every read and write (lightweight transactions use `SERIAL`).
    pub consistency: Consistency,
    /// How long to wait for a first connection.
    pub connect_timeout: Duration,
    /// How long one request may take before the batch fails as unreachable.
    pub request_timeout: Duration,
    /// The role to log in as (`PasswordAuthenticator`); `None`: no authentication.
    pub username: Option<String>,
    /// Its password.
    pub password: Option<Secret>,
    /// The `[state]` key the password came from (`password` or `password_file`), for errors.
    pub password_key: &'static str,
    /// Connect with TLS, trusting the CA certificates of this PEM file (each node's certificate
    /// must name the address it is reached at); `None`: plain.
    pub ca_file: Option<PathBuf>,
}

impl Default for CassandraConfig {
    fn default() -> Self {
        CassandraConfig {
            nodes: vec![DEFAULT_NODE.to_string()],
            replication_factor: 1,
            consistency: Consistency::LocalQuorum,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(12),
            username: None,
            password: None,
            password_key: "password",
            ca_file: None,
        }
    }
}

impl CassandraConfig {
    /// One node at `addr` (`host:port`), defaults otherwise.
    pub fn node(addr: &str) -> Self {
        CassandraConfig {
            nodes: vec![addr.to_string()],
            ..CassandraConfig::default()
        }
    }

    /// Settings from `[state]`: `url` (one `host:port`) or `nodes = ["host:port", ...]`,
    /// `replication_factor` (a positive integer, default 1) and `consistency` (`one`, `two`,
    /// `three`, `quorum`, `all`, `local_quorum` (default), `each_quorum`, `local_one`),
    /// `username` with `password` or `password_file` (its first line; keeps the secret out
    /// of the configuration), `ca_file` (TLS, trusting this PEM file's CAs; read now). Any
    /// other key is an error naming it.
    pub fn from_settings(url: Option<&str>, options: &toml::Table) -> Result<Self, SettingError> {
        let mut c = CassandraConfig::default();
        for key in options.keys() {
            if !KEYS.contains(&key.as_str()) {
                return Err(SettingError::new(
                    key.as_str(),
                    "unknown key; backend \"cassandra\" takes url, nodes, replication_factor, consistency, username, password, password_file and ca_file",
                ));
            }
        }
        if let Some(url) = url {
            check_node("url", url)?;
            c.nodes = vec![url.to_string()];
        }
        if let Some(v) = options.get("nodes") {
            if url.is_some() {
                return Err(SettingError::new(
                    "nodes",
                    "give either url or nodes, not both",
                ));
            }
            let list = v.as_array().ok_or_else(|| {
                SettingError::new("nodes", "expected a list of \"host:port\" strings")
            })?;
            if list.is_empty() {
                return Err(SettingError::new(
                    "nodes",
                    "expected at least one \"host:port\"",
                ));
            }
            c.nodes = list
                .iter()
                .map(|n| {
                    let s = n.as_str().ok_or_else(|| {
                        SettingError::new("nodes", "expected a list of \"host:port\" strings")
                    })?;
                    check_node("nodes", s)?;
                    Ok(s.to_string())
                })
                .collect::<Result<_, SettingError>>()?;
        }
        if let Some(v) = options.get("replication_factor") {
            c.replication_factor = v
                .as_integer()
                .and_then(|n| u32::try_from(n).ok())
                .filter(|n| *n >= 1)
                .ok_or_else(|| {
                    SettingError::new("replication_factor", "expected a positive integer")
                })?;
        }
        if let Some(v) = options.get("consistency") {
            let s = v.as_str().unwrap_or_default();
            c.consistency = parse_consistency(s).ok_or_else(|| {
                SettingError::new(
                    "consistency",
                    "expected one of one, two, three, quorum, all, local_quorum, each_quorum, local_one",
                )
            })?;
        }
        let text = |key: &str| -> Result<Option<String>, SettingError> {
            match options.get(key) {
                None => Ok(None),
                Some(v) => match v.as_str() {
                    Some(s) if !s.is_empty() => Ok(Some(s.to_owned())),
                    _ => Err(SettingError::new(key, "expected a non-empty string")),
                },
            }
        };
        c.username = text("username")?;
        let password = text("password")?;
        let password_file = text("password_file")?;
        c.password = match (password, password_file) {
            (Some(_), Some(_)) => {
                return Err(SettingError::new(
                    "password_file",
                    "give the password in password or in password_file, not both",
                ))
            }
            (Some(p), None) => Some(Secret::new(p)),
            (None, Some(path)) => {
                c.password_key = "password_file";
                let t = flowstate_config::read_text(&path)
                    .map_err(|e| SettingError::new("password_file", format!("{path}: {e}")))?;
                match t.lines().next() {
                    Some(l) if !l.is_empty() => Some(Secret::new(l)),
                    _ => {
                        return Err(SettingError::new(
                            "password_file",
                            format!("{path}: empty (the password is its first line)"),
                        ))
                    }
                }
            }
            (None, None) => None,
        };
        match (&c.username, &c.password) {
            (Some(_), None) => {
                return Err(SettingError::new(
                    "password",
                    "username needs a password (password or password_file)",
                ))
            }
            (None, Some(_)) => {
                return Err(SettingError::new(
                    c.password_key,
                    "a password needs its username",
                ))
            }
            _ => {}
        }
        if let Some(path) = text("ca_file")? {
            let pem = std::fs::read(&path)
                .map_err(|e| SettingError::new("ca_file", format!("{path}: {e}")))?;
            match openssl::x509::X509::stack_from_pem(&pem) {
                Ok(certs) if !certs.is_empty() => {}
                _ => {
                    return Err(SettingError::new(
                        "ca_file",
                        format!("{path}: no PEM certificate (-----BEGIN CERTIFICATE-----) in it"),
                    ))
                }
            }
            c.ca_file = Some(path.into());
        }
        Ok(c)
    }

    /// The `[state]` key a failed connection points at, when it is not the address: a refused
    /// login names `username` and the password's key, a failed TLS handshake `ca_file`.
    pub fn key_of(&self, error: &str) -> Option<&'static str> {
        let e = error.to_ascii_lowercase();
        if e.contains("authenticat") || e.contains("password") || e.contains("credentials") {
            return Some(self.password_key);
        }
        let tls = ["certificate", "ssl", "tls", "handshake"];
        if tls.iter().any(|w| e.contains(w)) {
            return Some("ca_file");
        }
        None
    }
}

fn check_node(key: &str, s: &str) -> Result<(), SettingError> {
    match s.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => Ok(()),
        _ => Err(SettingError::new(
            key,
            format!("expected \"host:port\" (e.g. \"{DEFAULT_NODE}\"), got {s:?}"),
        )),
    }
}

fn parse_consistency(s: &str) -> Option<Consistency> {
    Some(match s.to_ascii_lowercase().as_str() {
        "one" => Consistency::One,
        "two" => Consistency::Two,
        "three" => Consistency::Three,
        "quorum" => Consistency::Quorum,
        "all" => Consistency::All,
        "local_quorum" => Consistency::LocalQuorum,
        "each_quorum" => Consistency::EachQuorum,
        "local_one" => Consistency::LocalOne,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: Option<&str>, toml: &str) -> Result<CassandraConfig, SettingError> {
        CassandraConfig::from_settings(url, &toml.parse::<toml::Table>().unwrap())
    }

    #[test]
    fn defaults_url_and_nodes() {
        assert_eq!(parse(None, "").unwrap(), CassandraConfig::default());
        assert_eq!(
            parse(Some("10.0.0.1:9043"), "").unwrap().nodes,
            ["10.0.0.1:9043"]
        );
        let c = parse(
            None,
            "nodes = [\"a:9042\", \"b:9042\"]\nreplication_factor = 3\nconsistency = \"QUORUM\"",
        )
        .unwrap();
        assert_eq!(c.nodes, ["a:9042", "b:9042"]);
        assert_eq!(c.replication_factor, 3);
        assert_eq!(c.consistency, Consistency::Quorum);
    }

    #[test]
    fn bad_settings_name_their_key() {
        let key = |r: Result<CassandraConfig, SettingError>| r.unwrap_err().key;
        assert_eq!(key(parse(None, "colour = 1")), "colour");
        assert_eq!(key(parse(Some("nohost"), "")), "url");
        assert_eq!(key(parse(Some("a:1"), "nodes = [\"b:2\"]")), "nodes");
        assert_eq!(key(parse(None, "nodes = []")), "nodes");
        assert_eq!(key(parse(None, "nodes = [1]")), "nodes");
        assert_eq!(key(parse(None, "nodes = [\"a:x\"]")), "nodes");
        assert_eq!(
            key(parse(None, "replication_factor = 0")),
            "replication_factor"
        );
        assert_eq!(
            key(parse(None, "replication_factor = \"1\"")),
            "replication_factor"
        );
        assert_eq!(key(parse(None, "consistency = \"most\"")), "consistency");
        assert_eq!(key(parse(None, "username = \"u\"")), "password");
        assert_eq!(key(parse(None, "password = \"p\"")), "password");
        assert_eq!(
            key(parse(None, "username = 1\npassword = \"p\"")),
            "username"
        );
        assert_eq!(
            key(parse(
                None,
                "username = \"u\"\npassword_file = \"/nonexistent\""
            )),
            "password_file"
        );
        assert_eq!(
            key(parse(
                None,
                "username = \"u\"\npassword = \"p\"\npassword_file = \"/nonexistent\""
            )),
            "password_file"
        );
        assert_eq!(
            key(parse(None, "ca_file = \"/nonexistent/ca.pem\"")),
            "ca_file"
        );
        let c = parse(None, "username = \"u\"\npassword = \"secret\"").unwrap();
        assert_eq!(c.password.as_ref().map(Secret::expose), Some("secret"));
        assert!(!format!("{c:?}").contains("secret"), "{c:?}");
    }
}
