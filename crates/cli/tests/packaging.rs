//! What operators install: every systemd unit of `packaging/systemd/` passes `systemd-analyze
//! verify` (with this build's binary standing in for `/usr/bin/flowstate`), and each starts
//! the command its role has, with options this binary takes; the container image's
//! `packaging/container/Containerfile` keeps its promises (read statically: no podman here).

use std::path::Path;
use std::process::Command;

const FLOWSTATE: &str = env!("CARGO_BIN_EXE_flowstate");

fn units() -> Vec<(String, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging/systemd");
    let mut units: Vec<(String, String)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "service"))
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read_to_string(&p).unwrap(),
            )
        })
        .collect();
    units.sort();
    units
}

#[test]
fn every_unit_verifies() {
    let units = units();
    let names: Vec<&str> = units.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "flowstate-box.service",
            "flowstate-controller.service",
            "flowstate-instance@.service",
            "flowstate-root.service",
            "flowstate-store.service"
        ]
    );
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in &units {
        std::fs::write(
            dir.path().join(name),
            text.replace("/usr/bin/flowstate", FLOWSTATE),
        )
        .unwrap();
    }
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .args(units.iter().map(|(n, _)| dir.path().join(n)))
        .output()
        .expect("systemd-analyze (scripts/setup installs systemd)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && stderr.trim().is_empty(), "{stderr}");
}

/// Each unit's command line is one this binary takes (`--help` after its options parses).
#[test]
fn every_unit_runs_a_command_of_this_binary() {
    for (name, text) in units() {
        let exec = text
            .lines()
            .find_map(|l| l.strip_prefix("ExecStart=/usr/bin/flowstate "))
            .unwrap_or_else(|| panic!("{name}: no ExecStart of /usr/bin/flowstate"));
        let args: Vec<String> = exec
            .split_whitespace()
            .map(|a| {
                a.replace("%i", "3")
                    .replace("${FLOWSTATE_ADDRESS}", "192.0.2.13")
            })
            .collect();
        let out = Command::new(FLOWSTATE)
            .args(&args)
            .arg("--help")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{name}: flowstate {args:?} --help: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

fn packaging(path: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../packaging")
        .join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The Containerfile's instructions (comments out, continuation lines joined), each as
/// (INSTRUCTION, its arguments).
fn instructions(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut line = String::new();
    for l in text.lines() {
        let l = l.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        match l.strip_suffix('\\') {
            Some(l) => line.push_str(l),
            None => {
                line.push_str(l);
                let (op, args) = line.split_once(char::is_whitespace).unwrap_or((&line, ""));
                out.push((op.to_uppercase(), args.trim().to_string()));
                line.clear();
            }
        }
    }
    assert!(line.is_empty(), "the Containerfile ends in a continuation");
    out
}

/// What `packaging/container/Containerfile` promises, read without podman or a release build
/// (`bash scripts/image --run-test` runs the image): no base image, no shell step, an
/// unprivileged user of its own passwd, the binary as the entrypoint, the OCI labels.
#[test]
fn the_container_image_has_no_base_runs_unprivileged_and_enters_the_binary() {
    let ins = instructions(&packaging("container/Containerfile"));
    let of = |op: &str| -> Vec<&str> {
        ins.iter()
            .filter(|(o, _)| o == op)
            .map(|(_, a)| a.as_str())
            .collect()
    };

    assert_eq!(of("FROM"), ["scratch"], "one stage, from scratch");
    assert_eq!(ins[0].0, "FROM", "nothing before FROM");
    assert!(of("RUN").is_empty(), "scratch has no shell to RUN with");
    // What goes in is the root filesystem scripts/image assembles, nothing fetched.
    for (op, args) in ins.iter().filter(|(o, _)| o == "ADD" || o == "COPY") {
        assert!(
            !args.contains("://"),
            "{op} {args}: nothing from the network"
        );
    }
    assert!(
        ins.iter().any(|(o, a)| o == "ADD" && a == "rootfs.tar /"),
        "the root filesystem of scripts/image"
    );

    let users = of("USER");
    let user = *users.last().expect("a USER: not root by default");
    let (uid, gid) = user.split_once(':').unwrap_or((user, user));
    assert!(
        !["root", "0"].contains(&uid) && !["root", "0"].contains(&gid),
        "USER {user}"
    );
    // Numeric (Kubernetes' runAsNonRoot checks numbers only), and flowstate's in the image.
    let passwd = packaging("container/passwd");
    let flowstate = passwd
        .lines()
        .find(|l| l.starts_with("flowstate:"))
        .expect("flowstate in packaging/container/passwd");
    let fields: Vec<&str> = flowstate.split(':').collect();
    assert_eq!(
        (fields[2], fields[3]),
        (uid, gid),
        "USER {user} is flowstate: {flowstate}"
    );
    assert!(
        packaging("container/group")
            .lines()
            .any(|l| l.starts_with(&format!("flowstate:x:{gid}:"))),
        "group flowstate is {gid}"
    );
    let script =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/image"))
            .unwrap();
    assert!(
        script.contains(&format!("\nFLOWSTATE_UID={uid}\n")),
        "scripts/image's FLOWSTATE_UID is {uid}"
    );

    assert_eq!(of("ENTRYPOINT"), [r#"["/usr/bin/flowstate"]"#]);
    let labels = of("LABEL").join(" ");
    for label in [
        "title",
        "description",
        "version",
        "revision",
        "created",
        "licenses",
        "source",
    ] {
        assert!(
            labels.contains(&format!("org.opencontainers.image.{label}=")),
            "LABEL org.opencontainers.image.{label}"
        );
    }
}

/// The capabilities the Containerfile documents for each role are those of its systemd unit
/// (`CapabilityBoundingSet=`), so an operator gets the same sets either way.
#[test]
fn the_container_image_documents_each_units_capabilities() {
    let text = packaging("container/Containerfile");
    for (role, unit) in [
        ("box", "flowstate-box.service"),
        ("root", "flowstate-root.service"),
        ("controller", "flowstate-controller.service"),
        ("instance", "flowstate-instance@.service"),
        ("store", "flowstate-store.service"),
    ] {
        let unit_text = packaging(&format!("systemd/{unit}"));
        let mut from_unit: Vec<String> = unit_text
            .lines()
            .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
            .unwrap_or_else(|| panic!("{unit}: no CapabilityBoundingSet"))
            .split_whitespace()
            .map(|c| c.trim_start_matches("CAP_").to_string())
            .collect();
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix(&format!("#   {role} ")))
            .unwrap_or_else(|| panic!("the Containerfile documents no capabilities of {role}"));
        // The set is what comes before the first "(" or ",": "NET_RAW NET_ADMIN ...", or "none".
        let set = line.split(['(', ',']).next().unwrap().trim();
        let mut documented: Vec<String> = match set {
            "none" => Vec::new(),
            set => set.split_whitespace().map(str::to_string).collect(),
        };
        from_unit.sort();
        documented.sort();
        assert_eq!(
            documented, from_unit,
            "{role}: the Containerfile says {line:?}, {unit} differs"
        );
    }
}
