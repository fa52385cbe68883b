//! The backend conformance suite against a live store started in this process.

use flowstate_driver_store::StoreConnector;
use flowstate_state::conformance::{self, Options};
use flowstate_store::{Config, Server};

#[test]
fn store_passes_the_conformance_suite() {
    let server = Server::start(Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        shards: 3,
        ..Config::default()
    })
    .unwrap();
    let connector = StoreConnector::new(server.local_addr().to_string());
    conformance::run_all_with(&connector, &Options::EXACT);
    server.stop();
}

#[test]
fn store_with_a_data_dir_passes_the_conformance_suite() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: Some(dir.path().to_owned()),
        shards: 2,
        ..Config::default()
    })
    .unwrap();
    let connector = StoreConnector::new(server.local_addr().to_string());
    conformance::run_all_with(&connector, &Options::EXACT);
    server.stop();
}
