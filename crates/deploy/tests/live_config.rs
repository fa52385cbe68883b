//! `[input]`/`[output] interface`: the live box's configuration, and its errors.

use flowstate_deploy::config::{Driver, FastPathConfig, Input, LivePort, Output};
use flowstate_deploy::Config;
use std::time::Duration;

const CHAIN: &str = "[[chain]]\nnf = \"firewall\"\n";

fn parse(input: &str, output: &str) -> Result<Config, String> {
    Config::parse(
        &format!("[input]\n{input}\n[output]\n{output}\n{CHAIN}"),
        "live.toml",
    )
    .map_err(|e| e.to_string())
}

#[test]
fn a_live_box_names_both_ports() {
    let c = parse(
        "interface = \"fs-in\"\naddress = \"10.0.0.1\"\ndriver = \"af-xdp\"",
        "interface = \"fs-out\"\naddress = \"198.51.100.1\"\ngateway = \"198.51.100.254\"",
    )
    .unwrap();
    assert_eq!(
        c.input,
        Input::Interface(LivePort {
            interface: "fs-in".into(),
            address: "10.0.0.1".parse().unwrap(),
            gateway: None,
            address6: None,
            gateway6: None,
            driver: Driver::AfXdp,
            fast_path: Some(FastPathConfig {
                refresh: Duration::from_secs(1),
                capacity: 65536,
                required: false,
            }),
        })
    );
    assert_eq!(
        c.output,
        Output::Interface(LivePort {
            interface: "fs-out".into(),
            address: "198.51.100.1".parse().unwrap(),
            gateway: Some("198.51.100.254".parse().unwrap()),
            address6: None,
            gateway6: None,
            driver: Driver::AfXdp,
            fast_path: Some(FastPathConfig {
                refresh: Duration::from_secs(1),
                capacity: 65536,
                required: false,
            }),
        })
    );
    let d = parse(
        "interface = \"fs-in\"\naddress = \"10.0.0.1\"",
        "interface = \"fs-out\"\naddress = \"198.51.100.1\"",
    )
    .unwrap();
    assert!(matches!(
        d.input,
        Input::Interface(LivePort {
            driver: Driver::AfPacket,
            ..
        })
    ));
}

#[test]
fn errors_name_the_key() {
    let cases = [
        (
            "interface = \"fs-in\"\naddress = \"10.0.0.1\"",
            "discard = true",
            "output.interface",
        ),
        (
            "pcap = \"x.pcap\"",
            "interface = \"fs-out\"\naddress = \"198.51.100.1\"",
            "input.interface",
        ),
        (
            "interface = \"fs-in\"",
            "interface = \"fs-out\"\naddress = \"198.51.100.1\"",
            "input.address",
        ),
        (
            "interface = \"fs-in\"\naddress = \"10.0.0.300\"",
            "interface = \"fs-out\"\naddress = \"198.51.100.1\"",
            "input.address",
        ),
        (
            "interface = \"fs-in\"\naddress = \"10.0.0.1\"\ndriver = \"dpdk\"",
            "interface = \"fs-out\"\naddress = \"198.51.100.1\"",
            "input.driver",
        ),
        (
            "interface = \"a-name-much-too-long\"\naddress = \"10.0.0.1\"",
            "interface = \"fs-out\"\naddress = \"198.51.100.1\"",
            "input.interface",
        ),
        (
            "interface = \"fs-in\"\naddress = \"10.0.0.1\"\npcap = \"x.pcap\"",
            "interface = \"fs-out\"\naddress = \"198.51.100.1\"",
            "input",
        ),
        (
            "interface = \"fs-in\"\naddress = \"10.0.0.1\"",
            "interface = \"fs-out\"\naddress = \"198.51.100.1\"\npcap = \"o.pcap\"",
            "output",
        ),
        (
            "pcap = \"x.pcap\"\naddress = \"10.0.0.1\"",
            "discard = true",
            "input.address",
        ),
        (
            "pcap = \"x.pcap\"",
            "address = \"10.0.0.1\"",
            "output.address",
        ),
        (
            "interface = \"fs-in\"\naddress = \"10.0.0.1\"\ndriver = \"af-xdp\"\nfast_path_refresh = \"0s\"",
            "interface = \"fs-out\"\naddress = \"198.51.100.1\"",
            "input.fast_path_refresh",
        ),
        (
            "interface = \"fs-in\"\naddress = \"10.0.0.1\"\ndriver = \"af-xdp\"\nfast_path_refresh = \"2min\"",
            "interface = \"fs-out\"\naddress = \"198.51.100.1\"",
            "input.fast_path_refresh",
        ),
        (
            "interface = \"fs-in\"\naddress = \"10.0.0.1\"\ndriver = \"af-xdp\"\nfast_path_capacity = 0",
            "interface = \"fs-out\"\naddress = \"198.51.100.1\"",
            "input.fast_path_capacity",
        ),
        (
            "pcap = \"x.pcap\"\nfast_path = false",
            "discard = true",
            "input.fast_path",
        ),
    ];
    for (input, output, key) in cases {
        let e = parse(input, output).unwrap_err();
        assert!(e.contains("live.toml"), "{e}");
        assert!(e.contains(key), "[input] {input} / [output] {output}: {e}");
    }
}

#[test]
fn the_fast_path_is_on_unless_turned_off() {
    let port =
        |input: &str| match parse(input, "interface = \"fs-out\"\naddress = \"198.51.100.1\"")
            .unwrap()
            .input
        {
            Input::Interface(p) => p.fast_path,
            other => panic!("{other:?}"),
        };
    let xdp = "interface = \"fs-in\"\naddress = \"10.0.0.1\"\ndriver = \"af-xdp\"";
    assert_eq!(
        port(&format!(
            "{xdp}\nfast_path_refresh = \"250ms\"\nfast_path_capacity = 1000"
        )),
        Some(FastPathConfig {
            refresh: Duration::from_millis(250),
            capacity: 1000,
            required: false
        })
    );
    assert_eq!(port(&format!("{xdp}\nfast_path = false")), None);
    assert!(port(&format!("{xdp}\nfast_path = true")).is_some_and(|f| f.required));
    assert_eq!(
        port("interface = \"fs-in\"\naddress = \"10.0.0.1\""),
        Some(FastPathConfig {
            refresh: Duration::from_secs(1),
            capacity: 65536,
            required: false
        })
    );
}

#[test]
fn a_live_box_runs_one_worker_unless_told_otherwise() {
    let d = parse(
        "interface = \"fs-in\"\naddress = \"10.0.0.1\"",
        "interface = \"fs-out\"\naddress = \"198.51.100.1\"",
    )
    .unwrap();
    assert_eq!(d.runtime.workers, 1);
    let two = Config::parse(
        "[input]\ninterface = \"fs-in\"\naddress = \"10.0.0.1\"\n\
         [output]\ninterface = \"fs-out\"\naddress = \"198.51.100.1\"\n\
         [runtime]\nworkers = 2\n[[chain]]\nnf = \"firewall\"\n",
        "live.toml",
    )
    .unwrap();
    assert_eq!(two.runtime.workers, 2);
}

#[test]
fn runtime_nice_is_checked() {
    let text = |n: &str| {
        format!(
            "[input]\ninterface = \"fs-in\"\naddress = \"10.0.0.1\"\n\
             [output]\ninterface = \"fs-out\"\naddress = \"198.51.100.1\"\n\
             [runtime]\nnice = {n}\n{CHAIN}"
        )
    };
    let c = Config::parse(&text("-10"), "live.toml").unwrap();
    assert_eq!(c.runtime.nice, Some(-10));
    let d = parse(
        "interface = \"fs-in\"\naddress = \"10.0.0.1\"",
        "interface = \"fs-out\"\naddress = \"198.51.100.1\"",
    )
    .unwrap();
    assert_eq!(d.runtime.nice, None, "inherited unless given");
    for bad in ["-21", "20", "\"high\""] {
        let e = Config::parse(&text(bad), "live.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("runtime.nice"), "{bad}: {e}");
    }
}
