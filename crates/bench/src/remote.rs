//! The stores "remote" (FlexState Fig. 8): each in a network namespace of its own, reached
//! over a veth pair, so every store round trip crosses a network device as it would between
//! machines. Needs root and `ip`; started and removed by [`RemoteStores`] (namespace
//! `fs-flex<pid>`, addresses `10.253.<n>.1/30` on this side and `.2` in the namespace).
//!
//! Our store runs in this process (a thread enters the namespace before it binds), Redis and
//! a 3-node Redis Cluster as `redis-server`s in the namespace, Cassandra through
//! `scripts/cassandra` with `CASSANDRA_ADDRESS` set, all with persistence off and data under
//! a temporary directory. A store that cannot be started is named with the reason.
//!
//! On a machine with more than one CPU the stores run on every CPU but the last, which
//! [`crate::nf_throughput::chain_run`] gives its single worker: a remote store does not take
//! the NF's core, as on its own machine in FlexState's testbed.

use flowstate_state::Connector;
use std::fs::File;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A backend to measure, or why it cannot be.
pub(crate) type Candidate = (&'static str, Result<Arc<dyn Connector>, String>);

/// The stores in their namespace; dropping it stops them and removes the namespace.
pub(crate) struct RemoteStores {
    ns: String,
    host_if: String,
    addr: Ipv4Addr,
    dir: PathBuf,
    children: Vec<Child>,
    store: Option<flowstate_store::Server>,
    cassandra: bool,
}

/// The CPUs this process could use when first asked (before [`OffNfCpu`] narrowed the
/// calling thread's: a thread's own set is what `core_affinity` reports).
pub(crate) fn all_cpus() -> &'static [core_affinity::CoreId] {
    static CPUS: std::sync::OnceLock<Vec<core_affinity::CoreId>> = std::sync::OnceLock::new();
    CPUS.get_or_init(|| core_affinity::get_core_ids().unwrap_or_default())
}

/// Every CPU this process may use but the last, if there are at least two.
pub(crate) fn store_cpus() -> Option<Vec<usize>> {
    let ids: Vec<usize> = all_cpus().iter().map(|c| c.id).collect();
    (ids.len() >= 2).then(|| ids[..ids.len() - 1].to_vec())
}

fn run(argv: &[&str]) -> Result<(), String> {
    let out = Command::new(argv[0])
        .args(&argv[1..])
        .output()
        .map_err(|e| format!("{}: {e}", argv[0]))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`{}` failed: {}",
            argv.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Waits up to `limit` for `ready`.
fn wait_for(limit: Duration, mut ready: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if ready() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

impl RemoteStores {
    /// Creates the namespace and its link. Nothing is started yet.
    pub(crate) fn create() -> Result<Self, String> {
        let pid = std::process::id();
        let ns = format!("fs-flex{pid}");
        let host_if = format!("fsfx{}h", pid % 100_000);
        let peer_if = format!("fsfx{}n", pid % 100_000);
        let net = (pid % 250) as u8;
        let addr = Ipv4Addr::new(10, 253, net, 2);
        let dir = std::env::temp_dir().join(format!("flowstate-remote-{pid}"));
        let mut me = RemoteStores {
            ns: ns.clone(),
            host_if: host_if.clone(),
            addr,
            dir,
            children: Vec::new(),
            store: None,
            cassandra: false,
        };
        std::fs::create_dir_all(&me.dir).map_err(|e| format!("{}: {e}", me.dir.display()))?;
        let host = format!("10.253.{net}.1/30");
        let inner = format!("{addr}/30");
        run(&["ip", "netns", "add", &ns])?;
        run(&[
            "ip", "link", "add", &host_if, "type", "veth", "peer", "name", &peer_if,
        ])?;
        run(&["ip", "link", "set", &peer_if, "netns", &ns])?;
        run(&["ip", "addr", "add", &host, "dev", &host_if])?;
        run(&["ip", "link", "set", &host_if, "up"])?;
        let in_ns = |args: &[&str]| {
            let mut argv = vec!["ip", "netns", "exec", ns.as_str()];
            argv.extend_from_slice(args);
            run(&argv)
        };
        in_ns(&["ip", "addr", "add", &inner, "dev", &peer_if])?;
        in_ns(&["ip", "link", "set", &peer_if, "up"])?;
        in_ns(&["ip", "link", "set", "lo", "up"])?;
        me.host_if = host_if;
        Ok(me)
    }

    /// A command run in the namespace (on the stores' CPUs); the caller adds the program.
    fn in_ns(&self) -> Command {
        let mut cmd = match store_cpus() {
            Some(cpus) => {
                let list: Vec<String> = cpus.iter().map(usize::to_string).collect();
                let mut c = Command::new("taskset");
                c.args(["-c", &list.join(","), "ip"]);
                c
            }
            None => Command::new("ip"),
        };
        cmd.args(["netns", "exec", &self.ns]);
        cmd
    }

    /// Where the stores listen.
    pub(crate) fn address(&self) -> Ipv4Addr {
        self.addr
    }

    /// Starts every store (Cassandra only if `cassandra`) and returns a connector or the
    /// reason for each, named `<backend>-remote`.
    pub(crate) fn start(&mut self, cassandra: bool) -> Vec<Candidate> {
        let mut out: Vec<Candidate> = Vec::new();
        out.push(("store-remote", self.start_store()));
        out.push(("redis-remote", self.start_redis()));
        out.push(("redis-cluster-remote", self.start_cluster()));
        if cassandra {
            out.push(("cassandra-remote", self.start_cassandra()));
        } else {
            out.push(("cassandra-remote", Err("not in a quick run".into())));
        }
        out
    }

    fn start_store(&mut self) -> Result<Arc<dyn Connector>, String> {
        let listen = std::net::SocketAddr::from((self.addr, 7878));
        let ns = self.ns.clone();
        let cpus = store_cpus();
        // The listener is bound, and the server's threads are started, inside the namespace
        // and on the stores' CPUs (threads inherit both).
        let server = std::thread::spawn(move || {
            enter(&ns)?;
            if let Some(cpus) = cpus {
                pin(&cpus)?;
            }
            flowstate_store::Server::start(flowstate_store::Config {
                listen,
                ..flowstate_store::Config::default()
            })
            .map_err(|e| format!("the store did not start: {e}"))
        })
        .join()
        .map_err(|_| "the store's start panicked".to_string())??;
        let c = flowstate_driver_store::StoreConnector::new(server.local_addr().to_string());
        self.store = Some(server);
        Ok(Arc::new(c))
    }

    fn redis_server(&mut self, port: u16, cluster: bool) -> Result<(), String> {
        let dir = self.dir.join(format!("redis-{port}"));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut cmd = self.in_ns();
        cmd.arg("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                &self.addr.to_string(),
            ])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .arg("--dir")
            .arg(&dir);
        if cluster {
            cmd.args([
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
            ]);
        }
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("redis-server: {e} (scripts/redis start installs it)"))?;
        self.children.push(child);
        let addr = std::net::SocketAddr::from((self.addr, port));
        if wait_for(Duration::from_secs(10), || {
            std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
        }) {
            Ok(())
        } else {
            Err(format!("redis-server on {addr} did not answer"))
        }
    }

    fn start_redis(&mut self) -> Result<Arc<dyn Connector>, String> {
        self.redis_server(6379, false)?;
        let c = flowstate_driver_redis::RedisConnector::new(&format!("redis://{}:6379", self.addr))
            .map_err(|e| e.to_string())?;
        c.connect().map_err(|e| e.to_string())?;
        Ok(Arc::new(c))
    }

    fn start_cluster(&mut self) -> Result<Arc<dyn Connector>, String> {
        let ports = [7001, 7002, 7003];
        for p in ports {
            self.redis_server(p, true)?;
        }
        let addrs: Vec<String> = ports.iter().map(|p| format!("{}:{p}", self.addr)).collect();
        let mut argv = vec![
            "ip",
            "netns",
            "exec",
            &self.ns,
            "redis-cli",
            "--cluster",
            "create",
        ];
        argv.extend(addrs.iter().map(String::as_str));
        argv.push("--cluster-yes");
        run(&argv)?;
        let nodes: Vec<String> = addrs.iter().map(|a| format!("redis://{a}")).collect();
        let c = flowstate_driver_redis::RedisClusterConnector::new(&nodes)
            .map_err(|e| e.to_string())?;
        // The cluster answers once every slot is served everywhere.
        if !wait_for(Duration::from_secs(20), || c.connect().is_ok()) {
            return Err("the cluster did not come up".into());
        }
        Ok(Arc::new(c))
    }

    fn start_cassandra(&mut self) -> Result<Arc<dyn Connector>, String> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/cassandra");
        if !script.exists() {
            return Err(format!("{} is missing", script.display()));
        }
        self.cassandra = true;
        let out = self
            .in_ns()
            .arg("bash")
            .arg(&script)
            .arg("start")
            .env("CASSANDRA_ADDRESS", self.addr.to_string())
            .env("CASSANDRA_DIR", self.dir.join("cassandra"))
            .output()
            .map_err(|e| format!("scripts/cassandra: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "scripts/cassandra start failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let config = flowstate_driver_cassandra::CassandraConfig {
            nodes: vec![format!("{}:9042", self.addr)],
            ..flowstate_driver_cassandra::CassandraConfig::default()
        };
        let c = flowstate_driver_cassandra::CassandraConnector::new(config)
            .map_err(|e| e.to_string())?;
        Ok(Arc::new(c))
    }
}

/// Moves the calling thread into network namespace `ns`.
fn enter(ns: &str) -> Result<(), String> {
    let path = format!("/var/run/netns/{ns}");
    let f = File::open(&path).map_err(|e| format!("{path}: {e}"))?;
    // SAFETY: setns on a valid, open namespace file descriptor changes only this thread's
    // network namespace; the descriptor outlives the call.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(format!("setns {path}: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Keeps the calling thread, and the threads it starts meanwhile (store servers, drivers'
/// runtimes, state threads, which take the main thread's CPUs), off the NF's CPU: on
/// [`store_cpus`] until dropped, when its own CPUs are restored.
pub(crate) struct OffNfCpu(Option<libc::cpu_set_t>);

impl OffNfCpu {
    pub(crate) fn new() -> Self {
        let Some(cpus) = store_cpus() else {
            return OffNfCpu(None);
        };
        // SAFETY: sched_getaffinity(0) writes at most `size` bytes into the set given.
        let old = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            let size = std::mem::size_of::<libc::cpu_set_t>();
            (libc::sched_getaffinity(0, size, &mut set) == 0).then_some(set)
        };
        match old {
            Some(old) if pin(&cpus).is_ok() => OffNfCpu(Some(old)),
            _ => OffNfCpu(None),
        }
    }
}

impl Drop for OffNfCpu {
    fn drop(&mut self) {
        if let Some(old) = &self.0 {
            // SAFETY: restores a set sched_getaffinity filled, of the size passed.
            unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), old) };
        }
    }
}

/// Runs `f` on a thread of its own on the NF's CPU (the last one), like
/// [`crate::nf_throughput::chain_run`]'s worker.
pub(crate) fn on_nf_cpu<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    std::thread::scope(|s| {
        s.spawn(|| {
            if let Some(&core) = all_cpus().last() {
                core_affinity::set_for_current(core);
            }
            f()
        })
        .join()
        .expect("the NF thread panicked")
    })
}

/// Restricts the calling thread (and the threads it starts) to `cpus`.
fn pin(cpus: &[usize]) -> Result<(), String> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes within it for ids below
    // CPU_SETSIZE, which `sched_getaffinity`'s ids are; sched_setaffinity(0) affects this
    // thread only.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus {
            libc::CPU_SET(c, &mut set);
        }
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(format!(
                "sched_setaffinity: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    Ok(())
}

impl Drop for RemoteStores {
    fn drop(&mut self) {
        if let Some(s) = self.store.take() {
            s.stop();
        }
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        if self.cassandra {
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/cassandra");
            let _ = Command::new("bash")
                .arg(&script)
                .arg("stop")
                .env("CASSANDRA_DIR", self.dir.join("cassandra"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        let _ = run(&["ip", "link", "del", &self.host_if]);
        let _ = run(&["ip", "netns", "del", &self.ns]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
