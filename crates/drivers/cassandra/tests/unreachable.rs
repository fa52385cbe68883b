//! A store that cannot be reached: at start-up (no Cassandra needed) and when the connection
//! is lost in the middle of a run (through a proxy this test cuts; needs `scripts/cassandra
//! start`, skipped without it except in CI).

use flowstate_driver_cassandra::{CassandraConfig, CassandraConnector, DEFAULT_NODE};
use flowstate_state::{BackendError, Connector, Kind, ObjectKey, Op, Owner, Reply};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[test]
fn a_dead_node_at_start_up_is_unreachable_and_named() {
    // Nothing listens on port 1.
    let mut config = CassandraConfig::node("127.0.0.1:1");
    config.connect_timeout = Duration::from_secs(2);
    match CassandraConnector::new(config) {
        Err(BackendError::Unreachable { backend, reason }) => {
            assert_eq!(backend, "cassandra");
            assert!(reason.contains("127.0.0.1:1"), "{reason}");
        }
        Err(e) => panic!("expected Unreachable, got {e}"),
        Ok(_) => panic!("connected to a port where nothing listens"),
    }
}

/// A TCP proxy to `target` that can be cut: the listener stops accepting and every
/// connection is shut down.
struct Proxy {
    addr: String,
    cut: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    fn start(target: &str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let cut = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (target, c, cs) = (target.to_string(), cut.clone(), conns.clone());
        std::thread::spawn(move || {
            for inbound in listener.incoming() {
                let Ok(inbound) = inbound else { continue };
                if c.load(Ordering::SeqCst) {
                    let _ = inbound.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(outbound) = TcpStream::connect(&target) else {
                    continue;
                };
                let mut list = cs.lock().unwrap();
                list.push(inbound.try_clone().unwrap());
                list.push(outbound.try_clone().unwrap());
                for (mut from, mut to) in [
                    (inbound.try_clone().unwrap(), outbound.try_clone().unwrap()),
                    (outbound, inbound),
                ] {
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 16 * 1024];
                        while let Ok(n) = from.read(&mut buf) {
                            if n == 0 || to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                        let _ = to.shutdown(Shutdown::Both);
                    });
                }
            }
        });
        Proxy { addr, cut, conns }
    }

    fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        for c in self.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }
}

#[test]
fn losing_the_connection_fails_the_batch_as_unreachable() {
    if TcpStream::connect(DEFAULT_NODE).is_err() {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("CI=true but no Cassandra at {DEFAULT_NODE}; scripts/test starts one");
        }
        eprintln!("skipping: no Cassandra at {DEFAULT_NODE} (scripts/cassandra start)");
        return;
    }
    let proxy = Proxy::start(DEFAULT_NODE);
    let mut config = CassandraConfig::node(&proxy.addr);
    config.request_timeout = Duration::from_secs(3);
    let connector = CassandraConnector::new(config).expect("connect through the proxy");
    let mut backend = connector.connect().unwrap();
    let nf = format!("unreachable-{}", std::process::id());
    let key = ObjectKey::partitioned(&Owner::new(&nf, 0, 0), Kind::Counter, "c");
    let add = [Op::Add {
        key: key.clone(),
        delta: 1,
    }];
    let mut replies = Vec::new();
    backend
        .execute(&add, &mut replies)
        .expect("add before the cut");
    assert_eq!(replies, [Reply::Int(1)]);

    proxy.cut();
    replies.clear();
    match backend.execute(&add, &mut replies) {
        Err(BackendError::Unreachable { backend, .. }) => assert_eq!(backend, "cassandra"),
        other => panic!("expected Unreachable after the cut, got {other:?}"),
    }
    assert!(replies.is_empty());
    drop(backend);
    // Clean up through a direct connection.
    let direct = CassandraConnector::new(CassandraConfig::node(DEFAULT_NODE)).unwrap();
    direct.drop_nfs(|n| n == nf).unwrap();
}
