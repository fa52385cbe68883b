//! Builds the state store that `[state]` names (DESIGN "Layout": the binary builds the
//! backend and hands it to the runtime; the runtime depends on no driver).
//!
//! Each driver crate reads `[state]`'s `url` and its own keys from
//! [`StateSection::options`](flowstate_deploy::config::StateSection) and names the key that is
//! wrong in a [`SettingError`]; this module adds the file.

use flowstate_deploy::config::{BackendKind, StateSection};
use flowstate_deploy::{Config, ConfigError};
use flowstate_driver_cassandra::CassandraConfig;
use flowstate_driver_redis::{RedisClusterConnector, RedisConnector};
use flowstate_driver_store::StoreConnector;
use flowstate_state::{Connector, SettingError};
use std::path::Path;
use std::sync::Arc;

/// The store `[state]` names, its settings checked, not connected to.
pub(crate) enum Backend {
    /// The embedded store.
    Local,
    /// flowstate's store.
    Store(StoreConnector),
    /// One Redis server.
    Redis(Box<RedisConnector>),
    /// A Redis Cluster.
    RedisCluster(RedisClusterConnector),
    /// Cassandra (its driver connects when it is built).
    Cassandra(CassandraConfig),
}

/// The connector of the store `config`'s `[state]` names; a store that does not answer at
/// start-up is an error naming `url` (or `nodes`).
pub(crate) fn connector(config: &Config) -> Result<Arc<dyn Connector>, ConfigError> {
    connect(
        &config.file,
        &config.state,
        settings(&config.file, &config.state)?,
    )
}

/// Checks `[state]`'s settings for its backend (`url`, the driver's own keys) without
/// connecting to anything.
pub(crate) fn settings(file: &Path, state: &StateSection) -> Result<Backend, ConfigError> {
    let setting = |e: SettingError| ConfigError::new(file, format!("state.{}", e.key), e.reason);
    match state.backend {
        BackendKind::Local => {
            if let Some(key) = state.options.keys().next() {
                return Err(setting(SettingError::new(
                    key.as_str(),
                    "unknown key; backend \"local\" takes only backend, url, flush_interval and nf_instance",
                )));
            }
            Ok(Backend::Local)
        }
        BackendKind::Store => {
            let mut options = Vec::with_capacity(state.options.len());
            for (key, value) in &state.options {
                let text = match value {
                    toml::Value::String(s) => s.clone(),
                    toml::Value::Integer(i) => i.to_string(),
                    other => {
                        return Err(setting(SettingError::new(
                            key.as_str(),
                            format!("expected a string or an integer, got {}", other.type_str()),
                        )))
                    }
                };
                options.push((key.as_str(), text));
            }
            StoreConnector::from_config(
                state.url.as_deref(),
                options.iter().map(|(k, v)| (*k, v.as_str())),
            )
            .map(Backend::Store)
            .map_err(setting)
        }
        BackendKind::Cassandra => {
            CassandraConfig::from_settings(state.url.as_deref(), &state.options)
                .map(Backend::Cassandra)
                .map_err(setting)
        }
        BackendKind::Redis | BackendKind::RedisCluster => redis(state).map_err(setting),
    }
}

/// Connects to the store `backend` (checked by [`settings`]) at start-up.
pub(crate) fn connect(
    file: &Path,
    state: &StateSection,
    backend: Backend,
) -> Result<Arc<dyn Connector>, ConfigError> {
    let setting = |e: SettingError| ConfigError::new(file, format!("state.{}", e.key), e.reason);
    let url_key = |nodes: bool| {
        if state.url.is_some() || !nodes {
            "state.url"
        } else {
            "state.nodes"
        }
    };
    match backend {
        Backend::Local => Ok(Arc::new(flowstate_state::local::LocalStore::new())),
        // A refused token names `state.token`, an untrusted certificate (or TLS on one side
        // only) `state.ca_file`, a store that does not answer within `timeout` `state.url`.
        Backend::Store(c) => match c.check() {
            Ok(()) => Ok(Arc::new(c)),
            Err(e) => Err(setting(e)),
        },
        Backend::Cassandra(settings) => {
            let address = url_key(state.options.contains_key("nodes"));
            // A refused login names the password's key, a failed TLS handshake `ca_file`.
            let keys = settings.clone();
            let connector =
                flowstate_driver_cassandra::CassandraConnector::new(settings).map_err(|e| {
                    let text = e.to_string();
                    match keys.key_of(&text) {
                        Some(key) => ConfigError::new(file, format!("state.{key}"), text),
                        None => ConfigError::new(
                            file,
                            address,
                            format!(
                                "{text} (is Cassandra running? scripts/cassandra start runs one)"
                            ),
                        ),
                    }
                })?;
            Ok(Arc::new(connector))
        }
        // A refused password or certificate names its key (`state.password_file`,
        // `state.ca_file`, ...), a server that does not answer the address.
        Backend::Redis(c) => match c.check() {
            Ok(()) => Ok(Arc::new(*c)),
            Err(e) => Err(setting(e)),
        },
        Backend::RedisCluster(c) => {
            let key = url_key(true).trim_start_matches("state.");
            match c.check(key) {
                Ok(()) => Ok(Arc::new(c)),
                Err(e) => Err(setting(e)),
            }
        }
    }
}

impl Backend {
    /// What it is, for `flowstate check`: the backend and where it is.
    pub(crate) fn describe(&self, state: &StateSection) -> String {
        let name = state.backend.name();
        match (self, &state.url) {
            (Backend::Local, _) => name.to_owned(),
            (Backend::Store(c), _) => format!(
                "{name} at {}{}",
                c.settings().addr,
                if c.settings().ca_file.is_some() {
                    " (TLS)"
                } else {
                    ""
                }
            ),
            (Backend::Cassandra(c), _) => format!(
                "{name} at {}{}",
                c.nodes.join(", "),
                if c.ca_file.is_some() { " (TLS)" } else { "" }
            ),
            (_, Some(url)) => format!("{name} at {}", flowstate_driver_redis::redact(url)),
            (_, None) => match state.options.get("nodes") {
                Some(n) => format!("{name} at {n}"),
                None => format!("{name} (default address)"),
            },
        }
    }
}

/// `backend = "redis"` / `"redis-cluster"` (flowstate-driver-redis).
fn redis(state: &StateSection) -> Result<Backend, SettingError> {
    use flowstate_driver_redis::Setting;
    let mut lists = Vec::new();
    for (key, value) in &state.options {
        if let Some(items) = value.as_array() {
            let strings: Option<Vec<String>> = items
                .iter()
                .map(|v| v.as_str().map(str::to_owned))
                .collect();
            match strings {
                Some(l) => lists.push((key.as_str(), l)),
                None => {
                    return Err(SettingError::new(
                        key.as_str(),
                        "expected a list of strings",
                    ))
                }
            }
        }
    }
    let options = state.options.iter().map(|(key, value)| {
        let v = match (
            value.as_str(),
            lists.iter().find(|(k, _)| *k == key.as_str()),
        ) {
            (Some(s), _) => Setting::Str(s),
            (None, Some((_, l))) => Setting::List(l),
            (None, None) => match (value.as_bool(), value.as_integer()) {
                (Some(b), _) => Setting::Bool(b),
                (_, Some(n)) => Setting::Int(n),
                _ => Setting::Other(value.type_str()),
            },
        };
        (key.as_str(), v)
    });
    let url = state.url.as_deref();
    if state.backend == BackendKind::Redis {
        RedisConnector::from_settings(url, options).map(|c| Backend::Redis(Box::new(c)))
    } else {
        RedisClusterConnector::from_settings(url, options).map(Backend::RedisCluster)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INPUT: &str = "[input]\nsynthetic = { flows = 10 }\n";

    fn build(state: &str) -> Result<Arc<dyn Connector>, ConfigError> {
        let config =
            Config::parse(&format!("{INPUT}[state]\n{state}"), Path::new("t.toml")).unwrap();
        connector(&config)
    }

    #[test]
    fn store_is_built_and_names_bad_keys() {
        // Nothing listens on port 9: checked at start-up, the address is the key.
        let e = build(
            "backend = \"store\"\nurl = \"127.0.0.1:9\"\ntoken = \"t\"\ntimeout = \"100ms\"\n",
        )
        .err()
        .unwrap();
        assert_eq!(e.key, "state.url");
        assert!(e.reason.contains("unreachable"), "{e}");
        let server = flowstate_store::Server::start(flowstate_store::Config {
            listen: "127.0.0.1:0".parse().unwrap(),
            token: Some(flowstate_store::Secret::new("t")),
            ..flowstate_store::Config::default()
        })
        .unwrap();
        let addr = server.local_addr();
        let c = build(&format!(
            "backend = \"store\"\nurl = \"{addr}\"\ntoken = \"t\"\n"
        ))
        .unwrap();
        assert_eq!(c.name(), "store");
        let e = build(&format!(
            "backend = \"store\"\nurl = \"{addr}\"\ntoken = \"u\"\n"
        ))
        .err()
        .unwrap();
        assert_eq!(e.key, "state.token");
        server.stop();
        let e = build("backend = \"store\"\ncolour = \"red\"\n")
            .err()
            .unwrap();
        assert_eq!(e.key, "state.colour");
        let e = build("backend = \"store\"\nurl = \"nohost\"\n")
            .err()
            .unwrap();
        assert_eq!(e.key, "state.url");
        let e = build("backend = \"store\"\ntoken = [1]\n").err().unwrap();
        assert_eq!(e.key, "state.token");
    }

    #[test]
    fn local_is_built_and_takes_no_settings() {
        assert_eq!(build("backend = \"local\"\n").unwrap().name(), "local");
        let e = build("backend = \"local\"\ncolour = \"red\"\n")
            .err()
            .unwrap();
        assert_eq!(e.key, "state.colour");
        assert!(e.reason.contains("unknown key"), "{e}");
    }

    #[test]
    fn cassandra_settings_are_checked_and_a_dead_store_is_a_clear_error() {
        let e = build("backend = \"cassandra\"\nreplication = 3\n")
            .err()
            .unwrap();
        assert_eq!(e.key, "state.replication");
        let e = build("backend = \"cassandra\"\nconsistency = \"most\"\n")
            .err()
            .unwrap();
        assert_eq!(e.key, "state.consistency");
        // Nothing listens on port 1.
        let e = build("backend = \"cassandra\"\nurl = \"127.0.0.1:1\"\n")
            .err()
            .unwrap();
        assert_eq!(e.key, "state.url");
        assert!(e.reason.contains("unreachable"), "{e}");
        assert!(e.reason.contains("127.0.0.1:1"), "{e}");
    }

    #[test]
    fn redis_settings_are_checked_and_a_dead_store_is_an_error() {
        let e = build("backend = \"redis\"\nurl = \"redis://127.0.0.1:1\"\n")
            .err()
            .unwrap();
        assert_eq!(e.key, "state.url");
        assert!(e.reason.contains("does not answer"), "{e}");
        let e = build("backend = \"redis\"\nurl = \"http://x\"\n")
            .err()
            .unwrap();
        assert_eq!(e.key, "state.url");
        let e = build("backend = \"redis\"\nhost = \"x\"\n").err().unwrap();
        assert_eq!(e.key, "state.host");
        let e = build("backend = \"redis-cluster\"\nnodes = [1, 2]\n")
            .err()
            .unwrap();
        assert_eq!(e.key, "state.nodes");
        let e = build("backend = \"redis-cluster\"\nnodes = [\"redis://127.0.0.1:1\"]\n")
            .err()
            .unwrap();
        assert_eq!(e.key, "state.nodes");
        assert!(e.reason.contains("does not answer"), "{e}");
        let e = build("backend = \"redis-cluster\"\ntimeout = 3\n")
            .err()
            .unwrap();
        assert_eq!(e.key, "state.timeout");
    }
}
