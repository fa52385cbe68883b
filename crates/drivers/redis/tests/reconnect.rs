//! A lost server is `BackendError::Unreachable` for the batch that saw it go; the next
//! `execute` after it is back connects again by itself.

mod common;

use flowstate_driver_redis::RedisConnector;
use flowstate_state::{BackendError, Connector, Kind, ObjectKey, Op, Reply};

#[test]
fn unreachable_while_down_then_reconnects() {
    let Some(mut server) = common::OwnServer::start() else {
        return;
    };
    let c = RedisConnector::new(&format!("redis://127.0.0.1:{}", server.port)).expect("url");
    let mut b = c.connect().expect("connect");
    let n = ObjectKey::shared("reconnect", Kind::Counter, "n");
    let add = [Op::Add {
        key: n.clone(),
        delta: 2,
    }];
    let mut r = Vec::new();
    b.execute(&add, &mut r).expect("up");
    assert_eq!(r, vec![Reply::Int(2)]);

    server.stop();
    for _ in 0..2 {
        r.clear();
        match b.execute(&add, &mut r) {
            Err(BackendError::Unreachable {
                backend: "redis",
                reason,
            }) => {
                assert!(reason.contains(&server.port.to_string()), "{reason}")
            }
            other => panic!("expected Unreachable, got {other:?} {r:?}"),
        }
    }
    // A connector asked while it is down says so too.
    assert!(matches!(
        c.connect().err(),
        Some(BackendError::Unreachable { .. })
    ));

    server.restart().expect("restart");
    r.clear();
    b.execute(&add, &mut r).expect("reconnected");
    // A fresh (empty) server: the count starts again.
    assert_eq!(r, vec![Reply::Int(2)]);
}
