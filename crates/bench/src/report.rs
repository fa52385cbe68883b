//! The JSON result of a benchmark run.

use serde::Serialize;
use std::collections::BTreeMap;

/// One benchmark's result. `metrics` and `ratios` are flat maps from snake_case names to
/// numbers; the names a benchmark documents are a contract other tools read.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Benchmark name.
    pub name: String,
    /// Parameters the run used.
    pub params: BTreeMap<String, serde_json::Value>,
    /// Measured figures (absolute; noisy on shared machines).
    pub metrics: BTreeMap<String, f64>,
    /// Ratios between variants measured in the same run: the claims.
    pub ratios: BTreeMap<String, f64>,
    /// The machine it ran on.
    pub machine: Machine,
}

impl Report {
    /// An empty report for `name`, stamped with this machine.
    pub fn new(name: &str) -> Self {
        Report {
            name: name.to_owned(),
            params: BTreeMap::new(),
            metrics: BTreeMap::new(),
            ratios: BTreeMap::new(),
            machine: Machine::current(),
        }
    }

    /// Records a parameter.
    pub fn param(&mut self, key: &str, value: impl Into<serde_json::Value>) -> &mut Self {
        self.params.insert(key.to_owned(), value.into());
        self
    }

    /// Records a metric.
    pub fn metric(&mut self, key: &str, value: f64) -> &mut Self {
        self.metrics.insert(key.to_owned(), value);
        self
    }

    /// Records a ratio.
    pub fn ratio(&mut self, key: &str, value: f64) -> &mut Self {
        self.ratios.insert(key.to_owned(), value);
        self
    }

    /// The report as pretty-printed JSON.
    pub fn to_json(&self) -> String {
        // Serialising maps of strings and finite numbers cannot fail; non-finite numbers
        // become `null` in serde_json.
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
}

/// What the numbers were measured on.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    /// CPU model name from `/proc/cpuinfo`, or `unknown`.
    pub cpu: String,
    /// Logical CPUs available to this process.
    pub cores: usize,
    /// `std::env::consts::OS` and `ARCH`.
    pub os: String,
    /// Whether the CPU has the CRC32C instruction.
    pub crc32c_hw: bool,
    /// flowstate's version.
    pub flowstate: String,
}

impl Machine {
    /// Describes the machine this runs on.
    pub fn current() -> Self {
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split(':').nth(1))
                    .map(|m| m.trim().to_owned())
            })
            .unwrap_or_else(|| "unknown".to_owned());
        Machine {
            cpu,
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            os: format!("{}-{}", std::env::consts::OS, std::env::consts::ARCH),
            crc32c_hw: flowstate_wire::hash::crc32c_hw_available(),
            flowstate: env!("CARGO_PKG_VERSION").to_owned(),
        }
    }
}
