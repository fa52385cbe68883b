//! Our store over TLS (rustls on both sides) with its token: the conformance suite, large
//! pipelined batches, and the start-up check naming the key that is wrong; a plain client of a
//! TLS store is refused with a clear message while the store keeps serving the others.
//!
//! The certificates are made by `scripts/tls-certs` (openssl) into a directory of the test's
//! own.

use flowstate_driver_store::{Settings, StoreConnector};
use flowstate_state::conformance::{self, Options};
use flowstate_state::{Connector, Kind, ObjectKey, Op, Owner, Reply};
use flowstate_store::{Config, Server, StartError, TlsFiles};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// A directory with the test certificates, made once per test process.
fn certs() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("flowstate-store-tls-{}", std::process::id()));
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../scripts/tls-certs");
        let out = std::process::Command::new("bash")
            .arg(script)
            .arg(&dir)
            .output()
            .expect("run scripts/tls-certs");
        assert!(
            out.status.success(),
            "scripts/tls-certs: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        dir
    })
}

fn start(tls: bool, token: Option<&str>, shards: usize) -> Server {
    Server::start(Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        shards,
        token: token.map(flowstate_store::Secret::new),
        tls: tls.then(|| TlsFiles {
            cert: certs().join("server.pem"),
            key: certs().join("server.key"),
        }),
        ..Config::default()
    })
    .expect("start the store")
}

fn connector(server: &Server, token: Option<&str>, ca: Option<&str>) -> StoreConnector {
    connector_at(&server.local_addr().to_string(), token, ca)
}

fn connector_at(addr: &str, token: Option<&str>, ca: Option<&str>) -> StoreConnector {
    let mut options = vec![];
    if let Some(t) = token {
        options.push(("token", t.to_owned()));
    }
    if let Some(ca) = ca {
        options.push(("ca_file", certs().join(ca).to_string_lossy().into_owned()));
    }
    options.push(("timeout", "2s".to_owned()));
    StoreConnector::from_config(Some(addr), options.iter().map(|(k, v)| (*k, v.as_str())))
        .expect("settings")
}

#[test]
fn the_store_over_tls_with_a_token_passes_the_conformance_suite() {
    let server = start(true, Some("s3cret"), 3);
    let c = connector(&server, Some("s3cret"), Some("ca.pem"));
    c.check().expect("check");
    conformance::run_all_with(&c, &Options::EXACT);
    server.stop();
}

/// Megabytes each way in pipelined frames: TLS records split and joined anywhere, the socket
/// full on both sides; every reply arrives, in order.
#[test]
fn large_pipelined_batches_cross_tls_whole_and_in_order() {
    let server = start(true, None, 2);
    let c = connector(&server, None, Some("ca.pem"));
    let mut b = c.connect().expect("connect");
    let o = Owner::new("big", 0, 0);
    let value = |i: usize| -> Vec<u8> {
        (0..1000)
            .map(|j| ((i * 31 + j) % 251) as u8)
            .collect::<Vec<u8>>()
    };
    let keys: Vec<ObjectKey> = (0..20_000)
        .map(|i| ObjectKey::partitioned(&o, Kind::Value, &format!("v{i}")))
        .collect();
    let sets: Vec<Op> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| Op::Set {
            key: k.clone(),
            value: value(i),
        })
        .collect();
    let mut r = Vec::new();
    b.execute(&sets, &mut r).expect("set");
    assert_eq!(r.len(), keys.len());
    assert!(r.iter().all(|x| *x == Reply::Done));
    let gets: Vec<Op> = keys.iter().map(|k| Op::Get { key: k.clone() }).collect();
    r.clear();
    b.execute(&gets, &mut r).expect("get");
    for (i, got) in r.iter().enumerate() {
        assert_eq!(*got, Reply::Value(Some(value(i))), "reply {i}");
    }
    server.stop();
}

#[test]
fn a_plain_client_of_a_tls_store_is_refused_and_the_others_keep_being_served() {
    let server = start(true, Some("s3cret"), 1);
    let tls = connector(&server, Some("s3cret"), Some("ca.pem"));
    let mut b = tls.connect().expect("connect");
    let key = ObjectKey::partitioned(&Owner::new("n", 0, 0), Kind::Counter, "c");
    let add = [Op::Add {
        key: key.clone(),
        delta: 1,
    }];
    let mut r = Vec::new();
    b.execute(&add, &mut r).expect("add");

    // Our own driver without TLS: a clear error naming ca_file.
    let e = connector(&server, Some("s3cret"), None)
        .check()
        .unwrap_err();
    assert_eq!(e.key, "ca_file", "{e}");
    assert!(e.reason.contains("serves TLS only"), "{e}");
    // Anything else on the socket: one plain error frame, then the end.
    let mut raw = std::net::TcpStream::connect(server.local_addr()).expect("connect");
    raw.write_all(b"GET / HTTP/1.0\r\n\r\n").expect("write");
    let mut answer = Vec::new();
    raw.read_to_end(&mut answer).expect("read to the end");
    assert!(
        String::from_utf8_lossy(&answer).contains("serves TLS only"),
        "{answer:?}"
    );
    // A TLS client that closes in the middle of its handshake.
    let mut cut = std::net::TcpStream::connect(server.local_addr()).expect("connect");
    cut.write_all(&[0x16, 0x03, 0x01, 0x02]).expect("write");
    drop(cut);

    r.clear();
    b.execute(&add, &mut r).expect("the TLS client goes on");
    assert_eq!(r, vec![Reply::Int(2)]);
    let mut other = tls.connect().expect("a new TLS client");
    r.clear();
    other
        .execute(&[Op::GetCounter { key }], &mut r)
        .expect("get");
    assert_eq!(r, vec![Reply::Int(2)]);
    server.stop();
}

#[test]
fn a_wrong_token_a_wrong_ca_and_tls_to_a_plain_store_name_their_keys() {
    let server = start(true, Some("s3cret"), 1);
    let e = connector(&server, Some("wrong"), Some("ca.pem"))
        .check()
        .unwrap_err();
    assert_eq!(e.key, "token", "{e}");
    let e = connector(&server, None, Some("ca.pem"))
        .check()
        .unwrap_err();
    assert_eq!(e.key, "token", "{e}");
    let e = connector(&server, Some("s3cret"), Some("other-ca.pem"))
        .check()
        .unwrap_err();
    assert_eq!(e.key, "ca_file", "{e}");
    assert!(e.reason.contains("not trusted"), "{e}");
    // The certificate names 127.0.0.1 and localhost, not other addresses of the host.
    let port = server.local_addr().port();
    connector_at(&format!("localhost:{port}"), Some("s3cret"), Some("ca.pem"))
        .check()
        .expect("localhost is in the certificate");
    server.stop();

    let plain = start(false, None, 1);
    let e = connector(&plain, None, Some("ca.pem")).check().unwrap_err();
    assert_eq!(e.key, "ca_file", "{e}");
    assert!(e.reason.contains("serve TLS"), "{e}");
    // ... which keeps serving plain clients, whatever the first bytes of their first frame:
    // a batch whose length field starts 0x16 0x03, like a TLS record, is served.
    connector(&plain, None, None).check().expect("plain");
    let frame = |value: usize| {
        let mut out = Vec::new();
        flowstate_proto::encode(
            &flowstate_proto::Frame {
                id: 7,
                msg: flowstate_proto::Message::Batch {
                    op_id: 0,
                    ack_only: false,
                    ops: vec![flowstate_proto::Op::Set {
                        key: b"k".to_vec(),
                        value: vec![b'v'; value],
                    }
                    .into()],
                },
            },
            &mut out,
        );
        out
    };
    let base = frame(0).len();
    let bytes = frame(0x0316 + 4 - base);
    assert_eq!(
        &bytes[..2],
        &[0x16, 0x03],
        "a frame that starts like a TLS record"
    );
    let mut raw = std::net::TcpStream::connect(plain.local_addr()).expect("connect");
    raw.write_all(&bytes).expect("write");
    let mut head = [0u8; 16];
    raw.read_exact(&mut head).expect("an answer");
    assert_eq!(head[5], flowstate_proto::Message::REPLIES, "{head:?}");
    plain.stop();

    // Nothing there: the address.
    let e = connector_at("127.0.0.1:1", None, Some("ca.pem"))
        .check()
        .unwrap_err();
    assert_eq!(e.key, "url", "{e}");
}

#[test]
fn bad_tls_files_are_errors_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "hello\n").unwrap();
    let e = StoreConnector::from_config(None, [("ca_file", junk.to_str().unwrap())]).unwrap_err();
    assert_eq!(e.key, "ca_file");
    let e = StoreConnector::from_config(None, [("ca_file", "/nonexistent/ca.pem")]).unwrap_err();
    assert_eq!(e.key, "ca_file");
    assert!(e.reason.contains("/nonexistent/ca.pem"), "{e}");
    // A connector made from settings fails every attempt, and never falls back to plain TCP.
    let server = start(false, None, 1);
    let c = StoreConnector::with_settings(Settings {
        addr: server.local_addr().to_string(),
        ca_file: Some(junk.clone()),
        ..Settings::default()
    });
    assert!(c.open().is_err());
    server.stop();

    for (cert, key, which) in [
        (junk.clone(), certs().join("server.key"), "tls-cert"),
        (certs().join("server.pem"), junk.clone(), "tls-key"),
        (
            certs().join("server.pem"),
            certs().join("client.key"),
            "tls-key",
        ),
        (
            dir.path().join("absent.pem"),
            certs().join("server.key"),
            "tls-cert",
        ),
    ] {
        let e = Server::start(Config {
            listen: "127.0.0.1:0".parse().unwrap(),
            tls: Some(TlsFiles { cert, key }),
            ..Config::default()
        })
        .err()
        .expect("refused");
        assert!(
            matches!(&e, StartError::Tls { which: w, .. } if *w == which),
            "{which}: {e}"
        );
    }
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "\n").unwrap();
    let e = StoreConnector::from_config(None, [("token_file", token_file.to_str().unwrap())])
        .unwrap_err();
    assert_eq!(e.key, "token_file");
}
