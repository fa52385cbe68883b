//! Configuration: a full file parses; every error names the file, the key and what was
//! expected.

use flowstate_deploy::config::{BackendKind, Input, Output};
use flowstate_deploy::{run_config, Config, ConfigError, ConfigErrors};
use flowstate_io::pcap::PcapReader;
use flowstate_io::synth::Profile;
use std::path::Path;
use std::time::Duration;

const FULL: &str = r#"
[input]
synthetic = { profile = "short", flows = 100, packets = 20000, seed = 3 }
outbound_only = true

[output]
pcap = "out.pcap"

[runtime]
workers = 3
batch = 16
inside = ["10.0.0.0/8", "fd00::/8", "192.0.2.1"]
reflect = true

[state]
backend = "local"
flush_interval = "250us"
nf_instance = 4

[[chain]]
nf = "firewall"

[[chain]]
nf = "nat"
external = ["203.0.113.1"]
ports = "1024-65535"
"#;

fn parse(text: &str) -> Result<Config, ConfigErrors> {
    Config::parse(text, "test.toml")
}

/// Parses `text` expecting one error, at `key`, whose message contains `what`.
fn fails(text: &str, key: &str, what: &str) -> ConfigError {
    let errors = parse(text).expect_err(text);
    assert_eq!(errors.len(), 1, "{errors}");
    let e = errors.0.into_iter().next().unwrap();
    assert_eq!(e.key, key, "{e}");
    let msg = e.to_string();
    assert!(msg.starts_with("test.toml"), "{msg}");
    assert!(msg.contains(key), "{msg}");
    assert!(msg.contains(what), "{msg}");
    e
}

const INPUT: &str = "[input]\npcap = \"in.pcap\"\n";

#[test]
fn full_file() {
    let c = parse(FULL).unwrap();
    match &c.input {
        Input::Synthetic(s) => {
            assert_eq!(s.config.profile, Profile::Short);
            assert_eq!(
                (s.config.flows, s.config.packets, s.config.seed),
                (100, 20_000, 3)
            );
            assert!(!s.per_worker);
        }
        other => panic!("{other:?}"),
    }
    assert!(c.outbound_only);
    assert_eq!(c.output, Output::Pcap("out.pcap".into()));
    assert_eq!((c.runtime.workers, c.runtime.batch), (3, 16));
    assert_eq!(c.runtime.inside.len(), 3);
    assert_eq!(c.runtime.inside[2].to_string(), "192.0.2.1/32");
    assert!(c.runtime.reflect);
    assert_eq!(c.state.backend, BackendKind::Local);
    assert_eq!(c.state.flush_interval, Duration::from_micros(250));
    assert_eq!(c.state.nf_instance, 4);
    assert_eq!(c.chain.len(), 2);
    assert_eq!(c.chain[0].nf, "firewall");
    assert!(c.chain[0].options.is_empty());
    assert_eq!(c.chain[1].nf, "nat");
    assert_eq!(c.chain[1].options.len(), 2, "everything but nf");
    assert!(c.chain[1].options.contains_key("ports"));
}

#[test]
fn defaults() {
    let c = parse(INPUT).unwrap();
    assert_eq!(c.input, Input::Pcap("in.pcap".into()));
    assert_eq!(c.output, Output::Discard);
    assert_eq!(c.runtime.batch, 32);
    assert!(c.runtime.workers >= 1);
    assert!(!c.runtime.reflect);
    assert_eq!(c.state.flush_interval, Duration::from_millis(1));
    assert!(c.chain.is_empty());
}

#[test]
fn unknown_keys() {
    let e = fails(
        &format!("{INPUT}[runtime]\nwrkers = 2\n"),
        "runtime.wrkers",
        "unknown field",
    );
    assert_eq!(e.line, Some(4));
    assert!(e.reason.contains("workers"), "lists what is expected: {e}");
    let e = fails(&format!("{INPUT}[inputs]\n"), "inputs", "unknown section");
    assert_eq!(e.line, Some(3));
    fails(
        "[input]\nsynthetic = { profile = \"mixed\", flow = 10 }\n",
        "input.synthetic.flow",
        "unknown field",
    );
    // Under [state], keys the runtime does not know belong to the driver, which the binary
    // builds and which rejects them (crates/cli/src/backends.rs).
    let c = parse(&format!(
        "{INPUT}[state]\nbackend = \"local\"\nflush = \"1ms\"\n"
    ))
    .unwrap();
    assert_eq!(c.state.options.keys().collect::<Vec<_>>(), ["flush"]);
}

#[test]
fn fragment_limits_and_clients_only() {
    let c = parse(&format!(
        "{INPUT}[runtime]\nfragment_timeout = \"5s\"\nfragment_datagrams = 100\nfragments_held = 8\n"
    ))
    .unwrap();
    let f = c.runtime.fragments;
    assert_eq!(
        (f.timeout, f.datagrams, f.held),
        (Duration::from_secs(5), 100, 8)
    );
    let d = parse(INPUT).unwrap().runtime.fragments;
    assert_eq!(
        (d.timeout, d.datagrams, d.held),
        (Duration::from_secs(30), 16_384, 256)
    );
    for (key, value, says) in [
        ("fragment_timeout", "\"0s\"", "more than zero"),
        ("fragment_timeout", "\"soon\"", ""),
        ("fragment_datagrams", "0", "expected 1 to"),
        ("fragments_held", "100000", "expected 1 to"),
    ] {
        fails(
            &format!("{INPUT}[runtime]\n{key} = {value}\n"),
            &format!("runtime.{key}"),
            says,
        );
    }
    let c = parse("[input]\nsynthetic = { profile = \"mixed\", clients_only = true }\n").unwrap();
    match &c.input {
        Input::Synthetic(s) => assert!(s.config.clients_only),
        other => panic!("{other:?}"),
    }
    fails(
        "[input]\nsynthetic = { profile = \"scan\", clients_only = true }\n",
        "input.synthetic.clients_only",
        "not for the scan profile",
    );
}

#[test]
fn wrong_types_and_ranges() {
    fails(
        &format!("{INPUT}[runtime]\nworkers = \"two\"\n"),
        "runtime.workers",
        "expected",
    );
    fails(
        &format!("{INPUT}[runtime]\nworkers = 0\n"),
        "runtime.workers",
        "expected 1 to",
    );
    fails(
        &format!("{INPUT}[runtime]\nbatch = 100000\n"),
        "runtime.batch",
        "expected 1 to",
    );
    fails(
        &format!("{INPUT}[runtime]\nreflect = \"yes\"\n"),
        "runtime.reflect",
        "expected a boolean",
    );
    fails(
        "[input]\nsynthetic = { profile = \"mixed\", flows = -3 }\n",
        "input.synthetic.flows",
        "expected u64",
    );
    fails(
        "[input]\nsynthetic = { profile = \"tiny\" }\n",
        "input.synthetic.profile",
        "unknown profile",
    );
    fails(
        "[input]\nsynthetic = { profile = \"mixed\", flows = 0 }\n",
        "input.synthetic.flows",
        "at least 1",
    );
    fails(
        "[input]\nsynthetic = { flows = 100, packets = 10 }\n",
        "input.synthetic.packets",
        "needs at least",
    );
    fails(
        "[input]\nsynthetic = { size = \"huge\" }\n",
        "input.synthetic.size",
        "imix",
    );
}

#[test]
fn bad_duration() {
    fails(
        &format!("{INPUT}[state]\nflush_interval = \"1 parsec\"\n"),
        "state.flush_interval",
        "\"1 parsec\" is not a duration",
    );
    let e = fails(
        &format!("{INPUT}[state]\nflush_interval = 5\n"),
        "state.flush_interval",
        "write a duration with its unit, e.g. \"5s\"",
    );
    assert_eq!(e.line, Some(4));
    let c = parse(&format!("{INPUT}[state]\nflush_interval = \"1.5ms\"\n")).unwrap();
    assert_eq!(c.state.flush_interval, Duration::from_micros(1500));
    fails(
        "[input]\ninterface = \"a\"\naddress = \"10.0.0.1\"\nfast_path_refresh = 1\n[output]\ninterface = \"b\"\naddress = \"10.0.0.2\"\n",
        "input.fast_path_refresh",
        "\"1s\"",
    );
}

#[test]
fn bad_prefix() {
    fails(
        &format!("{INPUT}[runtime]\ninside = [\"10.0.0.0/8\", \"10.0.0.0/40\"]\n"),
        "runtime.inside[1]",
        "the prefix length must be 0 to 32",
    );
    // Host bits are refused alike in every section.
    fails(
        &format!("{INPUT}[runtime]\ninside = [\"10.0.0.1/8\"]\n"),
        "runtime.inside[0]",
        "10.0.0.1/8: host bits set; did you mean 10.0.0.0/8?",
    );
    fails(
        "[input]\nsynthetic = { servers_v4 = \"198.51.100.1/30\" }\n",
        "input.synthetic.servers_v4",
        "did you mean 198.51.100.0/30?",
    );
    fails(
        "[input]\nsynthetic = { clients_v6 = \"10.0.0.0/8\" }\n",
        "input.synthetic.clients_v6",
        "expected an IPv6 one",
    );
    fails(
        &format!("{INPUT}[[chain]]\nnf = \"firewall\"\nrules = [{{ action = \"deny\", dst = \"192.0.2.1/24\" }}]\n"),
        "chain[0].firewall.rules[0].dst",
        "did you mean 192.0.2.0/24?",
    );
}

#[test]
fn every_error_of_a_file_at_once() {
    let text = "[input]
synthetic = { profile = \"mixed\", flows = 0 }

[runtime]
workers = 0
wrkers = 2

[state]
flush_interval = \"soon\"

[[chain]]
nf = \"nat\"
external = [\"203.0.113.1\"]
udp = 30
colour = 1

[[chain]]
nf = \"firewall\"
timeouts = { udp_replied = \"0s\" }

[telemetry]
listen = \"nowhere\"
";
    let errors = parse(text).unwrap_err();
    let got: Vec<(Option<usize>, &str)> = errors.iter().map(|e| (e.line, e.key.as_str())).collect();
    assert_eq!(
        got,
        [
            (Some(2), "input.synthetic.flows"),
            (Some(6), "runtime.wrkers"),
            (Some(9), "state.flush_interval"),
            (Some(14), "chain[0].nat.udp"),
            (Some(15), "chain[0].nat.colour"),
            (Some(19), "chain[1].firewall.timeouts.udp_replied"),
            (Some(22), "telemetry.listen"),
        ],
        "{errors}"
    );
    let udp = &errors[3];
    assert_eq!(
        udp.to_string(),
        "test.toml:14: chain[0].nat.udp: write a duration with its unit, e.g. \"30s\""
    );
    // One error a line.
    assert_eq!(errors.to_string().lines().count(), errors.len());
    // A syntax error is the one error: the parser stops there.
    let e = parse(&format!("{text}[runtime]\nbatch = \n")).unwrap_err();
    assert_eq!(e.len(), 1, "{e}");
}

#[test]
fn backends() {
    fails(
        &format!("{INPUT}[state]\nbackend = \"mongodb\"\n"),
        "state.backend",
        "unknown backend \"mongodb\"; expected one of local, store, redis",
    );
    let c = parse(&format!(
        "{INPUT}[state]\nbackend = \"redis\"\nurl = \"127.0.0.1:6379\"\n"
    ))
    .unwrap();
    assert_eq!(c.state.backend, BackendKind::Redis);
    assert_eq!(c.state.url.as_deref(), Some("127.0.0.1:6379"));
    // Keys the runtime does not know are the driver's: kept for the binary to hand over.
    let c = parse(&format!(
        "{INPUT}[state]\nbackend = \"store\"\ntoken = \"s3cret\"\n"
    ))
    .unwrap();
    assert_eq!(c.state.options["token"].as_str(), Some("s3cret"));
}

#[test]
fn missing_or_contradictory_sections() {
    fails("", "input", "missing [input]");
    fails("[runtime]\nworkers = 1\n", "input", "missing [input]");
    fails("[input]\n", "input", "expected `pcap");
    fails(
        "[input]\npcap = \"a\"\nsynthetic = { profile = \"mixed\" }\n",
        "input",
        "not both",
    );
    fails(&format!("{INPUT}[output]\n"), "output", "discard = true");
    fails(
        &format!("{INPUT}[output]\npcap = \"o\"\ndiscard = true\n"),
        "output",
        "not both",
    );
    fails(
        &format!("{INPUT}[output]\npcap = \"in.pcap\"\n"),
        "output.pcap",
        "is the input file",
    );
    fails(
        &format!("{INPUT}[[chain]]\nexternal = 1\n"),
        "chain[0].nf",
        "missing",
    );
    fails(
        &format!("{INPUT}[[chain]]\nnf = \"counter\"\n[[chain]]\nnf = 3\n"),
        "chain[1].nf",
        "expected an NF name",
    );
}

#[test]
fn syntax_errors_give_the_line() {
    let e = parse(&format!("{INPUT}[runtime]\nworkers = \n")).unwrap_err();
    assert_eq!(e.len(), 1);
    assert_eq!(e[0].line, Some(4));
    assert!(e.to_string().starts_with("test.toml:4"), "{e}");
}

#[test]
fn stages_are_numbered_in_chain_order() {
    let c = parse(INPUT).unwrap();
    assert_eq!(c.stages(), 1);
    let c = parse(&format!(
        "{INPUT}[[chain]]\nnf = \"firewall\"\n[[chain]]\nnf = \"counter\"\n[[chain]]\nnf = \"nat\"\nstage = 1\nexternal = [\"203.0.113.1\"]\n"
    ))
    .unwrap();
    assert_eq!(c.stages(), 2);
    assert_eq!(
        c.chain.iter().map(|e| e.stage).collect::<Vec<_>>(),
        [0, 0, 1]
    );
    // `stage` is the runtime's key, not the NF's.
    assert!(!c.chain[2].options.contains_key("stage"));
    let stages = c.stage_factories().unwrap();
    let names = |k: usize| stages[k].iter().map(|f| f.name()).collect::<Vec<_>>();
    assert_eq!(
        (names(0), names(1)),
        (vec!["firewall", "counter"], vec!["nat"])
    );
    for (chain, key) in [
        ("nf = \"counter\"\nstage = 1", "chain[0].stage"),
        (
            "nf = \"counter\"\n[[chain]]\nnf = \"counter\"\nstage = 2",
            "chain[1].stage",
        ),
        (
            "nf = \"counter\"\nstage = 0\n[[chain]]\nnf = \"counter\"\nstage = -1",
            "chain[1].stage",
        ),
        ("nf = \"counter\"\nstage = \"one\"", "chain[0].stage"),
    ] {
        fails(&format!("{INPUT}[[chain]]\n{chain}\n"), key, "stage");
    }
}

#[test]
fn unknown_nf_and_bad_nf_options_name_the_entry() {
    let e = fails(
        &format!("{INPUT}[[chain]]\nnf = \"counter\"\n[[chain]]\nnf = \"teleporter\"\n"),
        "chain[1].nf",
        "unknown NF \"teleporter\"",
    );
    assert_eq!(e.line, Some(6));
    let e = fails(
        &format!("{INPUT}[[chain]]\nnf = \"counter\"\nmode = \"psychic\"\n"),
        "chain[0].counter.mode",
        "psychic",
    );
    assert_eq!(e.line, Some(5));
    // factories() builds what parse() checked.
    let c = parse(&format!("{INPUT}[[chain]]\nnf = \"counter\"\n")).unwrap();
    assert_eq!(c.factories().unwrap().len(), 1);
}

#[test]
fn load_names_a_missing_file() {
    let e = Config::load("/nonexistent/flowstate.toml").unwrap_err();
    assert!(
        e.to_string()
            .starts_with("/nonexistent/flowstate.toml: cannot read"),
        "{e}"
    );
}

#[test]
fn examples_parse() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            // Paths in an example are relative to the repository's root, where it is run
            // (parsing builds the NFs: the IPS reads its rules).
            let root = dir.join("..").display().to_string();
            let text = std::fs::read_to_string(&path)
                .unwrap()
                .replace("\"examples/", &format!("\"{root}/examples/"));
            let mut c = Config::parse(&text, &path).unwrap_or_else(|e| panic!("{e}"));
            if let Some(fp) = &mut c.fastpath {
                // A table pipeline instead of NFs; its prefix files load where they exist
                // (the real prefix set is beside the repository, not in it).
                for f in fp.prefix_files.iter_mut().flatten() {
                    f.path = dir.join("..").join(&f.path);
                }
                if fp.prefix_files.iter().flatten().all(|f| f.path.exists()) {
                    let rules = fp.load_rules().unwrap_or_else(|e| panic!("{e:?}"));
                    assert!(rules.iter().map(Vec::len).sum::<usize>() > 0);
                }
                n += 1;
                continue;
            }
            assert!(!c.chain.is_empty(), "{}", path.display());
            every_nf_reports_what_it_declares(&c);
            n += 1;
        }
    }
    assert!(n >= 4, "examples/{{nat,firewall,lb,chain}}.toml");
}

/// Each NF of `c`, built for a worker: the gauges it names are entries of its report, report
/// and labelled names are metric-safe (`snake_case`) and distinct, and its tables have
/// columns.
fn every_nf_reports_what_it_declares(c: &Config) {
    let store = flowstate_state::local::LocalStore::new();
    let mut part =
        flowstate_state::Partition::new(&store, flowstate_state::StateConfig::default()).unwrap();
    let snake = |n: &str| {
        !n.is_empty()
            && n.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    };
    for f in c.factories().unwrap() {
        let worker = flowstate_nf::Placement {
            partition: 0,
            partitions: 1,
            stage: 0,
        };
        let nf = f.build(&mut part.declare(f.name()), worker).unwrap();
        let report: Vec<&str> = nf.report().iter().map(|(k, _)| *k).collect();
        for g in nf.gauges() {
            assert!(
                report.contains(g),
                "{}: gauge {g} not in {report:?}",
                f.name()
            );
        }
        let labelled: Vec<&str> = nf.report_labelled().iter().map(|l| l.name).collect();
        for name in report.iter().chain(&labelled) {
            assert!(snake(name), "{}: {name:?}", f.name());
        }
        let mut all = report.clone();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), report.len(), "{}: {report:?}", f.name());
        assert!(labelled.iter().all(|l| !report.contains(l)), "{}", f.name());
        for t in f.tables() {
            assert!(
                !t.columns.is_empty() && snake(t.name),
                "{}.{}",
                f.name(),
                t.name
            );
        }
    }
}

fn local() -> std::sync::Arc<dyn flowstate_state::Connector> {
    std::sync::Arc::new(flowstate_state::local::LocalStore::new())
}

#[test]
fn run_config_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.pcap");
    let text = format!(
        "[input]\nsynthetic = {{ profile = \"mixed\", flows = 200, packets = 6000, per_worker = true }}\n\
         [output]\npcap = \"{}\"\n[runtime]\nworkers = 2\n[[chain]]\nnf = \"counter\"\n[[chain]]\nnf = \"monitor\"\n",
        out.display()
    );
    let c = parse(&text).unwrap();
    let seen = std::sync::atomic::AtomicU64::new(0);
    let progress = |n: u64| {
        seen.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    };
    let s = run_config(&c, local(), Some(&progress)).unwrap();
    assert_eq!(s.packets_in, 6_000);
    assert_eq!(s.packets_out, 6_000);
    assert_eq!(seen.into_inner(), 6_000);
    assert_eq!(s.nfs[0].report["packets_counted"], 6_000);
    let mut r = PcapReader::open(&out).unwrap();
    let mut k = 0;
    while r.next_packet().unwrap().is_some() {
        k += 1;
    }
    assert_eq!(k, 6_000);

    // The same through the dispatcher, reading the file just written.
    let text = format!(
        "[input]\npcap = \"{}\"\n[runtime]\nworkers = 2\n[[chain]]\nnf = \"counter\"\n",
        out.display()
    );
    let s = run_config(&parse(&text).unwrap(), local(), None).unwrap();
    assert_eq!((s.packets_in, s.packets_out), (6_000, 6_000));
}

mod never_panics {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn on_any_text(text in "\\PC{0,200}") {
            let _ = parse(&text);
        }

        #[test]
        fn on_a_damaged_full_file(cut in 0usize..FULL.len(), insert in "[\\[\\]{}=\"',.#a-z0-9 \n-]{0,8}") {
            let mut text = FULL.to_owned();
            let at = (0..=cut).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
            text.insert_str(at, &insert);
            if let Err(e) = parse(&text) {
                prop_assert!(e.to_string().starts_with("test.toml"));
            }
        }
    }
}

#[test]
fn flow_cache_keys() {
    assert_eq!(
        parse(INPUT).unwrap().runtime.flow_cache,
        None,
        "off by default"
    );
    let c = parse(&format!(
        "{INPUT}[runtime]\nflow_cache = true\nflow_cache_capacity = 4096\nflow_cache_refresh = \"250ms\"\n"
    ))
    .unwrap();
    let f = c.runtime.flow_cache.unwrap();
    assert_eq!((f.capacity, f.refresh), (4096, Duration::from_millis(250)));
    let d = parse(&format!("{INPUT}[runtime]\nflow_cache = true\n"))
        .unwrap()
        .runtime
        .flow_cache
        .unwrap();
    assert_eq!((d.capacity, d.refresh), (1 << 20, Duration::from_secs(1)));
    for (key, value, says) in [
        ("flow_cache_capacity", "3", "expected 4 to"),
        ("flow_cache_capacity", "1000000000", "expected 4 to"),
        ("flow_cache_refresh", "\"1ms\"", "expected 4ms to"),
        ("flow_cache_refresh", "\"2h\"", "expected 4ms to"),
    ] {
        fails(
            &format!("{INPUT}[runtime]\nflow_cache = true\n{key} = {value}\n"),
            &format!("runtime.{key}"),
            says,
        );
    }
    fails(
        &format!("{INPUT}[runtime]\nflow_cache = \"yes\"\n"),
        "runtime.flow_cache",
        "expected a boolean",
    );
    // A live box has the XDP fast path instead.
    fails(
        "[input]\ninterface = \"a\"\naddress = \"10.0.0.1\"\n[output]\ninterface = \"b\"\naddress = \"10.0.0.2\"\n[runtime]\nflow_cache = true\n",
        "runtime.flow_cache",
        "[input] fast_path",
    );
}
