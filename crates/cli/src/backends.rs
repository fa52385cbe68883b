//! Builds the state store that `[state]` names (DESIGN "Layout": the binary builds the
//! backend and hands it to the runtime; the runtime depends on no driver).
//!
//! Each driver crate reads `[state]`'s `url` and its own keys from
//! [`StateSection::options`](flowstate_chain::config::StateSection) and names the key that is
//! wrong in a [`SettingError`]; this module adds the file.

use flowstate_chain::config::BackendKind;
use flowstate_chain::{Config, ConfigError};
use flowstate_state::{Connector, SettingError};
use std::sync::Arc;

/// The connector of the store `config`'s `[state]` names.
pub(crate) fn connector(config: &Config) -> Result<Arc<dyn Connector>, ConfigError> {
    let state = &config.state;
    let setting =
        |e: SettingError| ConfigError::new(&config.file, format!("state.{}", e.key), e.reason);
    match state.backend {
        BackendKind::Local => {
            if let Some(key) = state.options.keys().next() {
                return Err(setting(SettingError::new(
                    key.as_str(),
                    "unknown key; backend \"local\" takes only backend, url, flush_interval and nf_instance",
                )));
            }
            Ok(Arc::new(flowstate_state::local::LocalStore::new()))
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
            let c = flowstate_driver_store::StoreConnector::from_config(
                state.url.as_deref(),
                options.iter().map(|(k, v)| (*k, v.as_str())),
            )
            .map_err(setting)?;
            Ok(Arc::new(c))
        }
        BackendKind::Cassandra => {
            use flowstate_driver_cassandra::{CassandraConfig, CassandraConnector};
            let settings = CassandraConfig::from_settings(state.url.as_deref(), &state.options)
                .map_err(setting)?;
            let key = if state.url.is_some() || !state.options.contains_key("nodes") {
                "state.url"
            } else {
                "state.nodes"
            };
            let connector = CassandraConnector::new(settings).map_err(|e| {
                ConfigError::new(
                    &config.file,
                    key,
                    format!("{e} (is Cassandra running? scripts/cassandra start runs one)"),
                )
            })?;
            Ok(Arc::new(connector))
        }
        BackendKind::Redis | BackendKind::RedisCluster => redis(config),
    }
}

/// `backend = "redis"` / `"redis-cluster"` (flowstate-driver-redis); a store that does not
/// answer at start-up is an error naming `url` (or `nodes`).
fn redis(config: &Config) -> Result<Arc<dyn Connector>, ConfigError> {
    use flowstate_driver_redis::{RedisClusterConnector, RedisConnector, Setting};
    let state = &config.state;
    let setting =
        |e: SettingError| ConfigError::new(&config.file, format!("state.{}", e.key), e.reason);
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
                    return Err(setting(SettingError::new(
                        key.as_str(),
                        "expected a list of strings",
                    )))
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
            (None, None) => Setting::Other(value.type_str()),
        };
        (key.as_str(), v)
    });
    let url = state.url.as_deref();
    let (connector, key): (Arc<dyn Connector>, &str) = if state.backend == BackendKind::Redis {
        let c = RedisConnector::from_settings(url, options).map_err(setting)?;
        (Arc::new(c), "url")
    } else {
        let c = RedisClusterConnector::from_settings(url, options).map_err(setting)?;
        let key = if url.is_some() { "url" } else { "nodes" };
        (Arc::new(c), key)
    };
    if let Err(e) = connector.connect() {
        return Err(setting(SettingError::new(
            key,
            format!("the store does not answer at start-up: {e}"),
        )));
    }
    Ok(connector)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const INPUT: &str = "[input]\nsynthetic = { flows = 10 }\n";

    fn build(state: &str) -> Result<Arc<dyn Connector>, ConfigError> {
        let config =
            Config::parse(&format!("{INPUT}[state]\n{state}"), Path::new("t.toml")).unwrap();
        connector(&config)
    }

    #[test]
    fn store_is_built_and_names_bad_keys() {
        let c = build("backend = \"store\"\nurl = \"127.0.0.1:9\"\ntoken = \"t\"\n").unwrap();
        assert_eq!(c.name(), "store");
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
