//! The IPS on hand-built packets: patterns split across segments and sent out of order,
//! overlapping segments, flow direction and state, alerts once per flow, `drop` blocking the
//! flow both ways, a flow taken over by a new worker on the same store (its partial match goes
//! on), configuration and rule-file errors naming what is wrong, and garbage.

use flowstate_nf::ips::{reason, Config, Factory, Ips};
use flowstate_nf::{BuildError, Context, Direction, NetworkFunction, Packet, Placement, Verdict};
use flowstate_state::local::LocalStore;
use flowstate_state::{
    Backend, BackendError, Connector, Kind, ObjectKey, Op, Partition, Reply, StateConfig,
};
use flowstate_testkit::{tcp4, udp4};
use flowstate_wire::{dissect, FlowKey};
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const ONE: Placement = Placement {
    stage: 0,
    partition: 0,
    partitions: 1,
};

const SYN: u8 = 0x02;
const ACK: u8 = 0x10;
const PSH: u8 = 0x08;

const CLIENT: (Ipv4Addr, u16) = (Ipv4Addr::new(10, 0, 0, 7), 40_000);
const SERVER: (Ipv4Addr, u16) = (Ipv4Addr::new(198, 51, 100, 80), 80);

fn tcp(src: (Ipv4Addr, u16), dst: (Ipv4Addr, u16), seq: u32, flags: u8, data: &[u8]) -> Vec<u8> {
    tcp4(src, dst, seq, 1, flags, data)
}

/// The local store seen as a remote one: state goes through the store, not only the cache.
struct Remote(LocalStore);

impl Connector for Remote {
    fn name(&self) -> &'static str {
        "remote-local"
    }
    fn connect(&self) -> Result<Box<dyn Backend>, BackendError> {
        self.0.connect()
    }
}

/// An IPS with `rules` (written to a file) on its own partition.
struct Rig {
    part: Partition,
    nf: Ips,
    now: u64,
    _dir: tempfile::TempDir,
}

fn config(rules: &str, extra: &str) -> (tempfile::TempDir, toml::Table) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("t.rules");
    std::fs::write(&file, rules).unwrap();
    let table = format!("rules = [{:?}]\n{extra}", file.to_str().unwrap())
        .parse()
        .unwrap();
    (dir, table)
}

impl Rig {
    fn new(rules: &str) -> Rig {
        Rig::on(&LocalStore::new(), rules)
    }

    fn on(store: &dyn Connector, rules: &str) -> Rig {
        Rig::with(store, rules, "")
    }

    fn feed(&mut self, mut f: Vec<u8>) -> Verdict {
        let d = dissect(&f).expect("dissects");
        let mut pkt = Packet {
            data: &mut f,
            dissection: d,
            direction: Direction::Outbound,
        };
        self.now += 1_000_000;
        let cx = Context {
            now: self.now,
            clock: 0,
            partition: 0,
        };
        self.nf.prefetch(&pkt);
        let v = self.nf.process(&mut pkt, &cx);
        self.nf.on_tick(self.now);
        v
    }

    fn counter(&self, name: &str) -> i64 {
        self.nf
            .report()
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| *v)
            .unwrap_or_else(|| panic!("{name} reported"))
    }

    fn fired(&self, sid: u32) -> bool {
        let k = FlowKey::new(CLIENT.0.into(), SERVER.0.into(), CLIENT.1, SERVER.1, 6);
        self.nf.flow(&k).is_some_and(|f| f.fired(sid))
    }
}

/// The client's handshake, then `segs` (offset into the client's stream, bytes) in the order
/// given.
fn client_stream(segs: &[(u32, &[u8])]) -> Vec<Vec<u8>> {
    let isn = 1000u32;
    let mut f = vec![
        tcp(CLIENT, SERVER, isn, SYN, b""),
        tcp(SERVER, CLIENT, 5000, SYN | ACK, b""),
        tcp(CLIENT, SERVER, isn + 1, ACK, b""),
    ];
    for (off, data) in segs {
        f.push(tcp(CLIENT, SERVER, isn + 1 + off, ACK | PSH, data));
    }
    f
}

const EVIL: &str = "alert tcp any any -> any 80 (msg:\"evil\"; flow:to_server,established; content:\"GET\"; depth:3; content:\"/evil.php\"; distance:0; sid:1; rev:1;)\n";

#[test]
fn a_pattern_split_across_segments_and_sent_out_of_order_alerts_once() {
    for order in [[0, 1, 2], [2, 0, 1], [1, 2, 0]] {
        let parts: [(u32, &[u8]); 3] = [(0, b"GET /ev"), (7, b"il.p"), (11, b"hp HTTP/1.0\r\n")];
        let mut r = Rig::new(EVIL);
        let segs: Vec<(u32, &[u8])> = order.iter().map(|&i| parts[i]).collect();
        for f in client_stream(&segs) {
            assert_eq!(r.feed(f), Verdict::Forward);
        }
        assert_eq!(r.counter("alerts"), 1, "order {order:?}");
        assert!(r.fired(1));
        // More of the same stream: no second alert for the flow.
        r.feed(tcp(
            CLIENT,
            SERVER,
            1001 + 24,
            ACK | PSH,
            b"GET /evil.php again",
        ));
        assert_eq!(r.counter("alerts"), 1);
    }
}

#[test]
fn nothing_alerts_when_the_rule_does_not_hold() {
    // Not at the stream's start (depth:3), from the server, before the handshake is seen.
    let mut r = Rig::new(EVIL);
    for f in client_stream(&[(0, b"HEAD / GET /evil.php")]) {
        r.feed(f);
    }
    r.feed(tcp(SERVER, CLIENT, 5001, ACK | PSH, b"GET /evil.php"));
    let mut r2 = Rig::new(EVIL);
    r2.feed(tcp(CLIENT, SERVER, 1, ACK | PSH, b"GET /evil.php"));
    assert_eq!((r.counter("alerts"), r2.counter("alerts")), (0, 0));
    assert!(
        r.counter("rules_checked") > 0,
        "the prefilter let it through"
    );
}

#[test]
fn overlapping_data_counts_as_the_first_policy_says_and_each_packet_is_inspected_too() {
    let rules = concat!(
        "alert tcp any any -> any any (msg:\"stream benign\"; content:\"GET BENIGN\"; sid:1;)\n",
        "alert tcp any any -> any any (msg:\"stream attack\"; content:\"GET ATTACK\"; sid:2;)\n",
        "alert tcp any any -> any any (msg:\"packet attack\"; content:\"ATTACK\"; sid:3;)\n",
    );
    let mut r = Rig::new(rules);
    // "BENIGN" arrives first (out of order), then a conflicting retransmission "ATTACK" over
    // it, then the hole before them.
    for f in client_stream(&[(4, b"BENIGN"), (4, b"ATTACK"), (0, b"GET ")]) {
        r.feed(f);
    }
    assert!(r.fired(1), "the stream has the first data");
    assert!(!r.fired(2), "the conflicting copy is not the stream");
    assert!(r.fired(3), "but the packet carrying it is inspected");
}

#[test]
fn flow_direction_and_udp() {
    let rules = concat!(
        "alert tcp any any -> any any (flow:to_client; content:\"200 OK\"; sid:1;)\n",
        "alert tcp any any -> any any (flow:to_server; content:\"200 OK\"; sid:2;)\n",
        "alert udp any any -> any 53 (content:\"|07|example\"; sid:3;)\n",
        "alert udp any any -> any any (flow:to_client; content:\"|07|example\"; sid:4;)\n",
        "alert udp any any -> any any (flow:established; content:\"answer\"; sid:5;)\n",
    );
    let mut r = Rig::new(rules);
    for f in client_stream(&[]) {
        r.feed(f);
    }
    r.feed(tcp(SERVER, CLIENT, 5001, ACK | PSH, b"HTTP/1.1 200 OK\r\n"));
    assert!(r.fired(1) && !r.fired(2));
    let dns = (Ipv4Addr::new(192, 0, 2, 53), 53);
    r.feed(udp4(
        CLIENT,
        dns,
        b"\x12\x34\x01\x00\x00\x01\x07example\x03com",
    ));
    r.feed(udp4(dns, CLIENT, b"\x12\x34\x81\x80\x07example answer"));
    let k = FlowKey::new(CLIENT.0.into(), dns.0.into(), CLIENT.1, dns.1, 17);
    let f = r.nf.flow(&k).expect("the UDP flow is tracked");
    assert!(f.fired(3), "to port 53");
    assert!(
        f.fired(4),
        "the answer goes to the client: the first sender"
    );
    assert!(f.fired(5), "both sides have sent");
    assert_eq!(r.counter("alerts"), 4);
}

#[test]
fn a_drop_rule_drops_the_packet_and_every_later_one_of_the_flow() {
    let rules = "drop tcp any any -> any 80 (msg:\"no\"; content:\"/etc/passwd\"; sid:9;)\n";
    let mut r = Rig::new(rules);
    let frames = client_stream(&[(0, b"GET /../../etc/pa"), (17, b"sswd HTTP/1.0\r\n")]);
    let verdicts: Vec<Verdict> = frames.into_iter().map(|f| r.feed(f)).collect();
    assert_eq!(verdicts.last(), Some(&Verdict::Drop("ips: drop rule")));
    assert!(verdicts[..verdicts.len() - 1]
        .iter()
        .all(|v| *v == Verdict::Forward));
    assert_eq!(
        r.feed(tcp(SERVER, CLIENT, 5001, ACK, b"")),
        Verdict::Drop("ips: blocked flow"),
        "the other direction too"
    );
    assert_eq!(
        r.feed(tcp(CLIENT, SERVER, 1040, ACK, b"")),
        Verdict::Drop("ips: blocked flow")
    );
    assert_eq!(r.counter("blocked_packets"), 3);
    assert_eq!(r.counter("alerts"), 1);
    // Another flow is not affected.
    let other = (CLIENT.0, CLIENT.1 + 1);
    assert_eq!(r.feed(tcp(other, SERVER, 1, SYN, b"")), Verdict::Forward);
}

/// Half of a split pattern on one worker, the rest on a new worker on the same store (a
/// failover): the stream, the handshake and the flow's state went through the store.
#[test]
fn a_new_worker_on_the_same_store_finishes_a_partial_match() {
    let store = Remote(LocalStore::new());
    let frames = client_stream(&[(0, b"GET /ev"), (7, b"il.php HTTP/1.0\r\n")]);
    let (first, rest) = frames.split_at(frames.len() - 1);
    let mut a = Rig::on(&store, EVIL);
    for f in first {
        a.feed(f.clone());
    }
    assert_eq!(a.counter("alerts"), 0);
    a.part.flush_all(a.now).unwrap();
    let mut b = Rig::on(&store, EVIL);
    b.now = a.now;
    b.feed(rest[0].clone());
    assert_eq!(b.counter("alerts"), 1);
    assert!(b.fired(1));
}

#[test]
fn streams_free_their_buffers_when_they_end() {
    const FIN: u8 = 0x01;
    let mut r = Rig::new(EVIL);
    for f in client_stream(&[(0, b"GET /index.html")]) {
        r.feed(f);
    }
    r.feed(tcp(SERVER, CLIENT, 5001, ACK | PSH, b"HTTP/1.0 200 OK\r\n"));
    assert_eq!(r.counter("stream_bytes_buffered"), 15 + 17);
    r.feed(tcp(CLIENT, SERVER, 1016, FIN | ACK, b""));
    assert_eq!(r.counter("stream_bytes_buffered"), 17);
    r.feed(tcp(SERVER, CLIENT, 5018, FIN | ACK, b""));
    assert_eq!(r.counter("stream_bytes_buffered"), 0);
    assert_eq!(r.counter("stream_gaps"), 0, "an end is not a gap");
}

#[test]
fn a_stream_is_inspected_up_to_its_depth() {
    let (dir, table) = config(
        "alert tcp any any -> any any (content:\"NEEDLE\"; sid:1;)\n",
        "depth = 16\n",
    );
    let f = Factory::new(Config::from_table(&table).unwrap()).unwrap();
    let mut part = Partition::new(&LocalStore::new(), StateConfig::default()).unwrap();
    let mut r = Rig {
        nf: f.build_ips(&mut part.declare("ips"), ONE).unwrap(),
        part,
        now: 1,
        _dir: dir,
    };
    // The needle straddles byte 16: only the stream could have seen it whole.
    for f in client_stream(&[(0, b"0123456789abNEE"), (15, b"DLE")]) {
        r.feed(f);
    }
    assert_eq!(r.counter("alerts"), 0);
    assert_eq!(r.counter("stream_depth_reached"), 1);
}

#[test]
fn configuration_and_rule_errors_name_what_is_wrong() {
    let err = |table: &toml::Table| match Config::from_table(table).and_then(Factory::new) {
        Err(BuildError::Config { key, reason, .. }) => format!("{key}: {reason}"),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("accepted"),
    };
    let t = |s: &str| s.parse::<toml::Table>().unwrap();
    assert!(err(&t("")).starts_with("rules: missing"));
    assert!(err(&t("rules = [\"/nonexistent/x.rules\"]")).contains("/nonexistent/x.rules"));
    assert!(err(&t("rules = [\"a\"]\ncolour = 1")).starts_with("colour: unknown field `colour`"));
    assert!(err(&t("rules = [\"a\"]\nudp_timeout = -1")).starts_with("udp_timeout"));
    assert_eq!(
        err(&t("rules = [\"a\"]\nudp_timeout = 300")),
        "udp_timeout: write a duration with its unit, e.g. \"300s\""
    );
    assert!(err(&t("rules = [\"a\"]\nudp_timeout = \"0s\""))
        .starts_with("udp_timeout: expected a duration above zero"));
    let (_d, table) = config(
        "alert tcp any any -> any any (sid:1;)\nalert tcp any any -> any any (content:\"x\"; pcre:\"/x/\"; sid:2;)\n",
        "",
    );
    let e = err(&table);
    assert!(e.contains("t.rules:2") && e.contains("pcre"), "{e}");
    let (_d, table) = config(
        "alert tcp any any -> any any (sid:1;)\nalert tcp any any -> any any (content:\"x\"; pcre:\"/x/\"; sid:2;)\n",
        "skip_unsupported = true\n",
    );
    let f = Factory::new(Config::from_table(&table).unwrap()).unwrap();
    assert_eq!(f.engine().rules().len(), 1);
    let (_d, table) = config(
        "alert tcp any any -> any any (sid:1;)\nalert udp any any -> any any (sid:1;)\n",
        "",
    );
    assert!(err(&table).contains("sid 1"));
    let (_d, table) = config(
        "alert tcp $NOPE any -> any any (sid:1;)\n",
        "vars = { HOME_NET = \"10.0.0.0/8\" }\n",
    );
    assert!(err(&table).contains("NOPE"));
}

#[test]
fn garbage_and_odd_packets_never_panic() {
    let mut r = Rig::new(concat!(
        "alert ip any any -> any any (content:\"a\"; sid:1;)\n",
        "alert tcp any any -> any any (sid:2;)\n",
    ));
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for len in 0..400usize {
        let mut f = tcp(
            CLIENT,
            SERVER,
            x as u32,
            (x >> 32) as u8,
            &vec![b'a'; len % 97],
        );
        for _ in 0..(len % 5) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let i = (x as usize) % f.len();
            f[i] ^= (x >> 40) as u8;
        }
        if let Ok(d) = dissect(&f) {
            let mut pkt = Packet {
                data: &mut f,
                dissection: d,
                direction: Direction::Inbound,
            };
            let cx = Context {
                now: r.now,
                clock: 0,
                partition: 0,
            };
            let _ = r.nf.process(&mut pkt, &cx);
        }
    }
    assert!(r.counter("alerts") > 0);
}

#[test]
fn the_factory_is_the_registry_s() {
    let (_d, table) = config("alert tcp any any -> any any (sid:1;)\n", "");
    let f = flowstate_nf::registry::factory("ips", &table).unwrap();
    assert_eq!(f.name(), "ips");
    let mut part = Partition::new(&LocalStore::new(), StateConfig::default()).unwrap();
    let nf = f
        .build(
            &mut part.declare("ips"),
            Placement {
                partition: 0,
                partitions: 1,
                stage: 0,
            },
        )
        .unwrap();
    assert_eq!(nf.name(), "ips");
}

impl Rig {
    /// An IPS with `rules` and the options `extra` on `store`.
    fn with(store: &dyn Connector, rules: &str, extra: &str) -> Rig {
        let (dir, table) = config(rules, extra);
        let f = Factory::new(Config::from_table(&table).unwrap()).unwrap();
        let mut part = Partition::new(store, StateConfig::default()).unwrap();
        let nf = f.build_ips(&mut part.declare("ips"), ONE).unwrap();
        Rig {
            part,
            nf,
            now: 1_700_000_000_000_000_000,
            _dir: dir,
        }
    }
}

/// A UDP datagram from client port `i` to the server (`back`: the server's answer).
fn udp_flow(i: u16, back: bool) -> Vec<u8> {
    let client = (CLIENT.0, 10_000 + i);
    let server = (SERVER.0, 53);
    if back {
        udp4(server, client, b"answer")
    } else {
        udp4(client, server, b"query")
    }
}

fn udp_key(i: u16) -> FlowKey {
    FlowKey::new(CLIENT.0.into(), SERVER.0.into(), 10_000 + i, 53, 17)
}

/// `max_flows` bounds the flow table: at the cap a new flow ends the oldest flow not
/// established (early drop), else it is refused and the exception policy applies to its
/// packet; established and blocked flows are never ended.
#[test]
fn the_flow_table_holds_at_most_max_flows_and_ends_unestablished_ones_first() {
    const CAP: usize = 3;
    const EXTRA: u16 = 5;
    let block = "drop udp any any -> any 53 (content:\"blockme\"; sid:9;)\n";
    for (extra, early_drop) in [
        ("", true),
        ("early_drop = false", false),
        ("early_drop = false\nexception_policy = \"pass\"", false),
    ] {
        let pass = extra.contains("pass");
        let mut r = Rig::with(
            &LocalStore::new(),
            block,
            &format!("max_flows = {CAP}\n{extra}"),
        );
        assert_eq!(r.counter("max_flows"), CAP as i64);
        // Flow 0 is established (both sides sent), flow 1 is blocked, flow 2 is neither.
        assert_eq!(r.feed(udp_flow(0, false)), Verdict::Forward);
        assert_eq!(r.feed(udp_flow(0, true)), Verdict::Forward);
        assert_eq!(
            r.feed(udp4((CLIENT.0, 10_001), (SERVER.0, 53), b"blockme")),
            Verdict::Drop(reason::DROP_RULE)
        );
        assert_eq!(r.feed(udp_flow(2, false)), Verdict::Forward);
        for i in 0..EXTRA {
            let v = r.feed(udp_flow(100 + i, false));
            let want = if early_drop || pass {
                Verdict::Forward
            } else {
                Verdict::Drop(reason::TABLE_FULL)
            };
            assert_eq!(v, want, "{extra:?}");
            assert!(r.nf.flows() <= CAP, "{extra:?}");
        }
        assert_eq!(r.nf.flows(), CAP, "{extra:?}");
        let excess = i64::from(EXTRA);
        if early_drop {
            assert_eq!(r.counter("flows_early_dropped"), excess);
            assert_eq!(r.counter("flows_table_full"), 0);
            assert_eq!(r.counter("exception_dropped"), 0);
        } else {
            assert_eq!(r.counter("flows_early_dropped"), 0);
            assert_eq!(r.counter("flows_table_full"), excess);
            let (dropped, passed) = if pass { (0, excess) } else { (excess, 0) };
            assert_eq!(r.counter("exception_dropped"), dropped, "{extra:?}");
            assert_eq!(r.counter("exception_passed"), passed, "{extra:?}");
        }
        // The established flow and the blocked one were kept; the blocked one still drops.
        assert!(r.nf.flow(&udp_key(0)).is_some(), "{extra:?}");
        assert!(r.nf.flow(&udp_key(1)).is_some_and(|f| f.blocked()));
        assert_eq!(
            r.feed(udp_flow(1, false)),
            Verdict::Drop(reason::BLOCKED),
            "{extra:?}"
        );
    }
}

/// The reassembly's table has the same cap: SYNs never answered make room for new ones, an
/// established connection keeps its stream and its flow.
#[test]
fn tcp_streams_hold_at_most_max_flows_and_established_ones_stay() {
    const EXTRA: i64 = 3;
    let mut r = Rig::with(&LocalStore::new(), EVIL, "max_flows = 2");
    for f in client_stream(&[]) {
        assert_eq!(r.feed(f), Verdict::Forward);
    }
    let syn = |port: u16| tcp((CLIENT.0, port), SERVER, 7, SYN, b"");
    assert_eq!(r.feed(syn(50_000)), Verdict::Forward);
    for i in 0..EXTRA as u16 {
        assert_eq!(r.feed(syn(50_001 + i)), Verdict::Forward);
        assert!(r.nf.streams() <= 2 && r.nf.flows() <= 2);
    }
    assert_eq!(r.counter("max_streams"), 2);
    assert_eq!(r.counter("streams_early_dropped"), EXTRA);
    assert_eq!(r.counter("flows_early_dropped"), EXTRA);
    assert_eq!((r.nf.streams(), r.nf.flows()), (2, 2));
    let k = FlowKey::new(CLIENT.0.into(), SERVER.0.into(), CLIENT.1, SERVER.1, 6);
    assert!(r.nf.flow(&k).is_some());
    // Its stream goes on where it was: the pattern alerts.
    for f in client_stream(&[(0, b"GET /evil.php HTTP/1.0\r\n")]).split_off(3) {
        r.feed(f);
    }
    assert_eq!(r.counter("alerts"), 1);
}

/// A store that can be taken down: every operation fails while it is.
struct Switch {
    store: LocalStore,
    down: Arc<AtomicBool>,
}

struct SwitchBackend {
    inner: Box<dyn Backend>,
    down: Arc<AtomicBool>,
}

impl SwitchBackend {
    fn check(&self) -> Result<(), BackendError> {
        if self.down.load(Ordering::Relaxed) {
            return Err(BackendError::Unreachable {
                backend: "switch",
                reason: "down".into(),
            });
        }
        Ok(())
    }
}

impl Backend for SwitchBackend {
    fn name(&self) -> &'static str {
        "switch"
    }
    fn execute(&mut self, ops: &[Op], replies: &mut Vec<Reply>) -> Result<(), BackendError> {
        self.check()?;
        self.inner.execute(ops, replies)
    }
    fn partitions(
        &mut self,
        nf: &str,
        kind: Kind,
        id: &str,
    ) -> Result<Vec<ObjectKey>, BackendError> {
        self.check()?;
        self.inner.partitions(nf, kind, id)
    }
}

impl Connector for Switch {
    fn name(&self) -> &'static str {
        "switch"
    }
    fn connect(&self) -> Result<Box<dyn Backend>, BackendError> {
        Ok(Box::new(SwitchBackend {
            inner: self.store.connect()?,
            down: Arc::clone(&self.down),
        }))
    }
}

/// State that cannot be read: the packet is dropped and counted by default
/// (`exception_policy = "drop"`, Suricata's drop-packet), forwarded and counted with `pass`.
#[test]
fn the_exception_policy_decides_packets_whose_state_is_unavailable() {
    for (extra, pass) in [
        ("", false),
        ("exception_policy = \"drop\"", false),
        ("exception_policy = \"pass\"", true),
    ] {
        let down = Arc::new(AtomicBool::new(false));
        let store = Switch {
            store: LocalStore::new(),
            down: Arc::clone(&down),
        };
        let mut r = Rig::with(&store, EVIL, extra);
        down.store(true, Ordering::Relaxed);
        let frames = [
            udp_flow(0, false),
            tcp(CLIENT, SERVER, 1000, SYN, b""),
            tcp(CLIENT, SERVER, 1001, ACK | PSH, b"GET /evil.php"),
        ];
        let n = frames.len() as i64;
        for f in frames {
            let want = if pass {
                Verdict::Forward
            } else {
                Verdict::Drop(reason::STATE)
            };
            assert_eq!(r.feed(f), want, "{extra:?}");
        }
        assert_eq!(r.counter("state_unavailable"), n, "{extra:?}");
        let (dropped, passed) = if pass { (0, n) } else { (n, 0) };
        assert_eq!(r.counter("exception_dropped"), dropped, "{extra:?}");
        assert_eq!(r.counter("exception_passed"), passed, "{extra:?}");
        // The store is back: packets are inspected again.
        down.store(false, Ordering::Relaxed);
        assert_eq!(r.feed(udp_flow(0, false)), Verdict::Forward);
        assert_eq!(r.counter("exception_dropped"), dropped, "{extra:?}");
    }
}

#[test]
fn cap_and_exception_keys_are_checked() {
    for (extra, key) in [
        ("max_flows = 0", "max_flows"),
        ("max_flows = -5", "max_flows"),
        ("early_drop = \"no\"", "early_drop"),
        ("exception_policy = \"bypass\"", "exception_policy"),
        ("exception_policy = 1", "exception_policy"),
    ] {
        let (_dir, table) = config(EVIL, extra);
        match Config::from_table(&table) {
            Err(BuildError::Config { key: k, .. }) => assert_eq!(k, key, "{extra}"),
            Err(e) => panic!("{extra}: {e}"),
            Ok(_) => panic!("{extra}: accepted"),
        }
    }
}

/// A reload with a rule file rewritten (`flowstate reload`): the next bytes of a flow meet the
/// new rules, with more rules than before too; the alerts already raised stay, and the same
/// rules again change nothing.
#[test]
fn reloaded_rules_meet_a_flow_s_next_bytes() {
    use flowstate_nf::NfFactory;
    let first = "alert tcp any any -> any 80 (msg:\"one\"; content:\"alpha\"; sid:1; rev:1;)\n";
    let mut r = Rig::new(first);
    let (dir, table) = config(first, "");
    let running = Factory::new(Config::from_table(&table).unwrap())
        .unwrap()
        .reload_config(None)
        .unwrap()
        .expect("an IPS reloads its rules");
    let mut off = 0u32;
    let mut send = |r: &mut Rig, data: &[u8]| {
        let v = r.feed(tcp(CLIENT, SERVER, 1001 + off, ACK | PSH, data));
        off += data.len() as u32;
        v
    };
    for f in client_stream(&[]) {
        r.feed(f);
    }
    send(&mut r, b"alpha beta ");
    assert!(r.fired(1) && !r.fired(2));
    // The file rewritten with a second rule, and read again.
    let second = format!(
        "{first}alert tcp any any -> any 80 (msg:\"two\"; content:\"gamma\"; sid:2; rev:1;)\n\
         alert tcp any any -> any 80 (msg:\"three\"; content:\"delta\"; sid:3; rev:1;)\n"
    );
    std::fs::write(dir.path().join("t.rules"), &second).unwrap();
    let again = Factory::new(Config::from_table(&table).unwrap()).unwrap();
    let reloaded = again
        .reload_config(Some(&running))
        .unwrap()
        .expect("the rules changed");
    assert!(
        again.reload_config(Some(&reloaded)).unwrap().is_none(),
        "the same rules: nothing to change"
    );
    r.nf.reconfigure(&reloaded);
    send(&mut r, b"gamma delta ");
    assert!(r.fired(1) && r.fired(2) && r.fired(3));
    assert_eq!(r.counter("alerts"), 3);
}
