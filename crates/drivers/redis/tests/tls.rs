//! Redis as operators run it: TLS (`rediss://`), an ACL user whose password is in a file, a
//! server that wants client certificates; and the start-up check naming the key that is wrong.
//!
//! Needs `scripts/redis start --tls` and `scripts/redis-cluster start --tls` (TLS only, default
//! user disabled, user `flowstate`, certificates from `scripts/tls-certs`). In CI (`CI=true`) a
//! missing server fails the test; elsewhere the test is skipped with a message.

mod common;

use flowstate_driver_redis::{RedisClusterConnector, RedisConnector, Setting};
use flowstate_state::conformance::{self, Options, CHECKS};
use flowstate_state::{Connector, Kind, ObjectKey, Op, Owner, Reply};

const OPTIONS: Options = Options {
    exact_found_kind: false,
    ..Options::EXACT
};

fn connector(url: &str, keys: &[(&'static str, String)]) -> RedisConnector {
    let settings = keys.iter().map(|(k, v)| (*k, Setting::Str(v)));
    RedisConnector::from_settings(Some(url), settings).expect("settings")
}

fn tls_url() -> String {
    let port = std::env::var("REDIS_TLS_PORT").unwrap_or_else(|_| "6380".into());
    format!("rediss://flowstate@127.0.0.1:{port}")
}

#[test]
fn redis_over_tls_as_an_acl_user_passes_the_conformance_suite() {
    let Some(c) = common::redis_tls() else { return };
    for (name, _) in CHECKS {
        eprintln!("redis over TLS: {name}");
        conformance::run_check_with(&c, name, &OPTIONS);
    }
}

#[test]
fn redis_cluster_over_tls_passes_the_conformance_suite_on_every_master() {
    let Some(c) = common::cluster_tls() else {
        return;
    };
    for (name, _) in CHECKS {
        eprintln!("redis-cluster over TLS: {name}");
        conformance::run_check_with(&c, name, &OPTIONS);
    }
    // One partition per master at least: 64 owners spread over the slots, each written and
    // read back through the node it hashes to (opened from the slot map, with the seed's TLS
    // settings and user).
    let mut b = c.connect().expect("connect");
    let nf = format!("tls-spread-{}", std::process::id());
    let keys: Vec<ObjectKey> = (0..64)
        .map(|core| ObjectKey::partitioned(&Owner::new(&nf, 0, core), Kind::Counter, "n"))
        .collect();
    let adds: Vec<Op> = keys
        .iter()
        .map(|k| Op::Add {
            key: k.clone(),
            delta: 3,
        })
        .collect();
    let mut r = Vec::new();
    b.execute(&adds, &mut r).expect("execute");
    assert_eq!(r, vec![Reply::Int(3); 64]);
    let dels: Vec<Op> = keys.into_iter().map(|key| Op::Delete { key }).collect();
    r.clear();
    b.execute(&dels, &mut r).expect("execute");
}

#[test]
fn a_wrong_password_a_missing_one_and_a_wrong_ca_name_their_keys() {
    if common::redis_tls().is_none() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let wrong = dir.path().join("wrong");
    std::fs::write(&wrong, "not-the-password\n").expect("write");
    let wrong = wrong.to_string_lossy().into_owned();
    let ca = common::tls_file("ca.pem");
    let other_ca = common::tls_file("other-ca.pem");
    let password = common::tls_file("password");

    let e = connector(
        &tls_url(),
        &[("password_file", wrong.clone()), ("ca_file", ca.clone())],
    )
    .check()
    .unwrap_err();
    assert_eq!(e.key, "password_file", "{e}");
    assert!(e.reason.contains("refused the user or password"), "{e}");

    // The password in the address: the address is the key.
    let url = tls_url().replace("flowstate@", "flowstate:not-it@");
    let e = connector(&url, &[("ca_file", ca.clone())])
        .check()
        .unwrap_err();
    assert_eq!(e.key, "url", "{e}");
    assert!(!e.reason.contains("not-it"), "no password in messages: {e}");

    // No password at all: the server answers NOAUTH.
    let url = tls_url().replace("flowstate@", "");
    let e = connector(&url, &[("ca_file", ca.clone())])
        .check()
        .unwrap_err();
    assert_eq!(e.key, "url", "{e}");

    let e = connector(
        &tls_url(),
        &[("password_file", password.clone()), ("ca_file", other_ca)],
    )
    .check()
    .unwrap_err();
    assert_eq!(e.key, "ca_file", "{e}");
    assert!(e.reason.contains("not trusted"), "{e}");

    // Without ca_file the system's roots do not know the test CA either.
    let e = connector(&tls_url(), &[("password_file", password.clone())])
        .check()
        .unwrap_err();
    assert_eq!(e.key, "ca_file", "{e}");

    // Unless verification is skipped, explicitly.
    let skip = [("password_file", password.clone())];
    let mut settings: Vec<(&str, Setting<'_>)> =
        skip.iter().map(|(k, v)| (*k, Setting::Str(v))).collect();
    settings.push(("tls_skip_verify", Setting::Bool(true)));
    RedisConnector::from_settings(Some(&tls_url()), settings)
        .expect("settings")
        .check()
        .expect("tls_skip_verify accepts the certificate");

    // A plain client on the TLS port is not answered; the message says what to try.
    let url = tls_url().replace("rediss://", "redis://");
    let e = connector(&url, &[("password_file", password)])
        .check()
        .unwrap_err();
    assert_eq!(e.key, "url", "{e}");

    // The cluster: the same keys.
    if common::cluster_tls().is_some() {
        let port = std::env::var("REDIS_CLUSTER_TLS_PORT").unwrap_or_else(|_| "7101".into());
        let url = format!("rediss://flowstate@127.0.0.1:{port}");
        let settings = [("password_file", wrong), ("ca_file", ca)];
        let c = RedisClusterConnector::from_settings(
            None,
            [
                ("nodes", Setting::Str(&url)),
                ("password_file", Setting::Str(&settings[0].1)),
                ("ca_file", Setting::Str(&settings[1].1)),
            ],
        )
        .expect("settings");
        let e = c.check("nodes").unwrap_err();
        assert_eq!(e.key, "password_file", "{e}");
    }
}

#[test]
fn a_server_wanting_client_certificates_takes_ours_and_names_cert_file_without() {
    let Some(server) = common::OwnServer::start_mutual_tls() else {
        return;
    };
    let url = format!("rediss://127.0.0.1:{}", server.port);
    let ca = ("ca_file", common::tls_file("ca.pem"));
    let e = connector(&url, std::slice::from_ref(&ca))
        .check()
        .unwrap_err();
    assert_eq!(e.key, "cert_file", "{e}");
    assert!(e.reason.contains("client certificate"), "{e}");
    let c = connector(
        &url,
        &[
            ca,
            ("cert_file", common::tls_file("client.pem")),
            ("key_file", common::tls_file("client.key")),
        ],
    );
    c.check().expect("the client certificate is taken");
    let mut b = c.connect().expect("connect");
    let key = ObjectKey::partitioned(&Owner::new("mtls", 0, 0), Kind::Value, "v");
    let mut r = Vec::new();
    b.execute(
        &[
            Op::Set {
                key: key.clone(),
                value: b"x".to_vec(),
            },
            Op::Get { key },
        ],
        &mut r,
    )
    .expect("execute");
    assert_eq!(r, vec![Reply::Done, Reply::Value(Some(b"x".to_vec()))]);
}

/// The legacy password (`requirepass`) in the address, `redis://:password@`, or in a file.
#[test]
fn a_legacy_password_works_from_the_address_or_a_file() {
    let Some(server) = common::OwnServer::start_requirepass("legacy-pw") else {
        return;
    };
    let port = server.port;
    connector(&format!("redis://:legacy-pw@127.0.0.1:{port}"), &[])
        .check()
        .expect("the password in the address");
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("pw");
    std::fs::write(&file, "legacy-pw\n").expect("write");
    let c = connector(
        &format!("redis://127.0.0.1:{port}"),
        &[("password_file", file.to_string_lossy().into_owned())],
    );
    c.check().expect("the password in a file");
    let mut b = c.connect().expect("connect");
    let key = ObjectKey::partitioned(&Owner::new("legacy", 0, 0), Kind::Counter, "n");
    let mut r = Vec::new();
    b.execute(&[Op::Add { key, delta: 2 }], &mut r)
        .expect("execute");
    assert_eq!(r, vec![Reply::Int(2)]);
    let e = connector(&format!("redis://:other@127.0.0.1:{port}"), &[])
        .check()
        .unwrap_err();
    assert_eq!(e.key, "url", "{e}");
    let e = connector(&format!("redis://127.0.0.1:{port}"), &[])
        .check()
        .unwrap_err();
    assert_eq!(e.key, "url", "{e}");
    assert!(e.reason.contains("refused the user or password"), "{e}");
}

#[test]
fn tls_settings_are_checked_when_read() {
    let ca = common::tls_file("ca.pem");
    let some = |k: &'static str, v: &'static str| vec![(k, v.to_owned())];
    let bad = |url: &str, keys: Vec<(&'static str, String)>| {
        let settings = keys.iter().map(|(k, v)| (*k, Setting::Str(v)));
        RedisConnector::from_settings(Some(url), settings).unwrap_err()
    };
    // TLS keys need a rediss:// address.
    let e = bad("redis://127.0.0.1:6379", vec![("ca_file", ca.clone())]);
    assert_eq!(e.key, "ca_file");
    let e = bad(
        "rediss://127.0.0.1:6380",
        some("ca_file", "/nonexistent/ca.pem"),
    );
    assert_eq!(e.key, "ca_file");
    assert!(e.reason.contains("/nonexistent/ca.pem"), "{e}");
    let e = bad(
        "rediss://127.0.0.1:6380",
        some("password_file", "/nonexistent/pw"),
    );
    assert_eq!(e.key, "password_file");
    // A file that is not PEM.
    let dir = tempfile::tempdir().expect("tempdir");
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "hello\n").expect("write");
    let junk = junk.to_string_lossy().into_owned();
    let e = bad("rediss://127.0.0.1:6380", vec![("ca_file", junk.clone())]);
    assert_eq!(e.key, "ca_file");
    let e = bad(
        "rediss://127.0.0.1:6380",
        vec![("cert_file", junk.clone()), ("key_file", junk)],
    );
    assert_eq!(e.key, "cert_file");
    // A certificate needs its key.
    let e = bad("rediss://127.0.0.1:6380", vec![("cert_file", ca.clone())]);
    assert_eq!(e.key, "key_file");
    // A password in two places.
    let pw = dir.path().join("pw");
    std::fs::write(&pw, "p\n").expect("write");
    let e = bad(
        "redis://:other@127.0.0.1:6379",
        vec![("password_file", pw.to_string_lossy().into_owned())],
    );
    assert_eq!(e.key, "password_file");
    // An empty password file.
    std::fs::write(&pw, "").expect("write");
    let e = bad(
        "redis://127.0.0.1:6379",
        vec![("password_file", pw.to_string_lossy().into_owned())],
    );
    assert_eq!(e.key, "password_file");
    // No #insecure shortcut in the address, and no bare strings for the switch.
    let e = bad("rediss://127.0.0.1:6380/#insecure", vec![]);
    assert_eq!(e.key, "url");
    let e = RedisConnector::from_settings(
        Some("rediss://127.0.0.1:6380"),
        [("tls_skip_verify", Setting::Str("yes"))],
    )
    .unwrap_err();
    assert_eq!(e.key, "tls_skip_verify");
    // A cluster is TLS throughout or not at all.
    let e = RedisClusterConnector::from_settings(
        Some("rediss://127.0.0.1:7101,redis://127.0.0.1:7002"),
        [],
    )
    .unwrap_err();
    assert_eq!(e.key, "url");
}
