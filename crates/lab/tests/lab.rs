//! Brings a real lab up and down (needs root, iproute2, ethtool, python3, iperf3:
//! scripts/setup-live).

use flowstate_lab::{Cmd, Exec, Lab, System, CLIENT_IF, HTTP_PORT, SERVER};

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

/// Takes the lab down however the test ends.
struct Guard(Lab);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.down(&mut System::default());
    }
}

fn sh(exec: &mut System, argv: Vec<String>) -> String {
    exec.run(&Cmd {
        argv,
        may_fail: false,
    })
    .unwrap()
}

#[test]
fn lab_comes_up_idempotently_and_goes_away() {
    if !is_root() {
        eprintln!("skipped: the lab needs root");
        return;
    }
    let prefix = format!("fs-lt{}-", std::process::id() % 100_000);
    let lab = Lab::new(&prefix).unwrap();
    let guard = Guard(lab.clone());
    let mut exec = System::default();
    assert!(lab.up(&mut exec).unwrap(), "made");
    let status = lab.status(&mut exec).unwrap();
    assert!(status.complete, "{status:?}");
    assert!(!lab.up(&mut exec).unwrap(), "second up makes nothing");

    // The client has its address and route; the server answers HTTP on its own namespace.
    let addr = sh(
        &mut exec,
        Lab::in_ns(
            &lab.client_ns(),
            &["ip", "-4", "-o", "addr", "show", CLIENT_IF],
        ),
    );
    assert!(addr.contains("10.0.0.2/24"), "{addr}");
    let body = sh(
        &mut exec,
        Lab::in_ns(
            &lab.server_ns(),
            &[
                "curl",
                "-sf",
                &format!("http://{SERVER}:{HTTP_PORT}/backend"),
            ],
        ),
    );
    assert_eq!(body, "a\n");
    // Nothing crosses the box yet: no one forwards.
    let ping = exec
        .run(&Cmd {
            argv: Lab::in_ns(
                &lab.client_ns(),
                &["ping", "-c1", "-W1", &SERVER.to_string()],
            ),
            may_fail: true,
        })
        .unwrap();
    assert!(!ping.contains(" 0% packet loss"), "{ping}");

    lab.down(&mut exec).unwrap();
    let status = lab.status(&mut exec).unwrap();
    assert!(
        status.namespaces.is_empty() && status.servers.is_empty(),
        "{status:?}"
    );
    assert!(!lab.state_dir().exists());
    drop(guard);
}
