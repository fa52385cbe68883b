//! One scrape's metrics: families of counters, gauges and histograms with labels, built from a
//! role's plain snapshot and encoded in the OpenMetrics text format by `prometheus-client`.
//!
//! A [`Metrics`] is built afresh for every scrape: it holds values, not live instruments, so
//! nothing it does touches the data path. Names follow the Prometheus conventions
//! (<https://prometheus.io/docs/practices/naming/>): `snake_case`, the base unit as a suffix
//! (`_seconds`, `_bytes`), and counters named without `_total`, which the exposition adds to
//! every counter sample (OpenMetrics 1.0 §"Counter"). Every name gets the prefix `flowstate_`.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::collections::HashMap;
use std::fmt;

/// The prefix of every metric's name.
pub const PREFIX: &str = "flowstate";

/// A sample's value.
#[derive(Debug, Clone, PartialEq)]
enum Value {
    CounterU(u64),
    CounterF(f64),
    GaugeI(i64),
    GaugeF(f64),
    Histogram(Histogram),
}

impl Value {
    fn kind(&self) -> Kind {
        match self {
            Value::CounterU(_) | Value::CounterF(_) => Kind::Counter,
            Value::GaugeI(_) | Value::GaugeF(_) => Kind::Gauge,
            Value::Histogram(_) => Kind::Histogram,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn metric_type(self) -> MetricType {
        match self {
            Kind::Counter => MetricType::Counter,
            Kind::Gauge => MetricType::Gauge,
            Kind::Histogram => MetricType::Histogram,
        }
    }
}

/// A histogram as its owner counted it: observations per bucket, their sum and count.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Histogram {
    /// `(upper bound, observations in this bucket)`: bounds increasing, counts per bucket
    /// (not cumulative; the exposition accumulates them). The last bound should be `f64::MAX`,
    /// written `+Inf`.
    pub buckets: Vec<(f64, u64)>,
    /// Sum of the observations.
    pub sum: f64,
    /// Number of observations.
    pub count: u64,
}

impl Histogram {
    /// A histogram from per-bucket counts over power-of-two bounds: `counts[i]` observations
    /// fell in `(2^(i-1)·unit, 2^i·unit]` (`counts[0]`: `≤ unit`), the last bucket holding
    /// everything larger (`+Inf`). `sum` is in the bounds' unit.
    pub fn from_log2(counts: &[u64], unit: f64, sum: f64) -> Self {
        let last = counts.len().saturating_sub(1);
        let buckets = counts
            .iter()
            .enumerate()
            .map(|(i, &c)| {
                let bound = if i < last {
                    unit * (1u64 << i.min(62)) as f64
                } else {
                    f64::MAX
                };
                (bound, c)
            })
            .collect();
        Histogram {
            buckets,
            sum,
            count: counts.iter().fold(0u64, |a, &c| a.saturating_add(c)),
        }
    }
}

#[derive(Debug, Clone)]
struct Family {
    name: String,
    help: String,
    kind: Kind,
    samples: Vec<(Vec<(String, String)>, Value)>,
}

/// The metrics of one scrape. See the module documentation.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    families: Vec<Family>,
    index: HashMap<String, usize>,
}

impl Metrics {
    /// No metrics yet.
    pub fn new() -> Self {
        Metrics::default()
    }

    /// A counter sample (`name` without `_total`).
    pub fn counter(&mut self, name: &str, help: &str, labels: &[(&str, &str)], value: u64) {
        self.add(name, help, labels, Value::CounterU(value));
    }

    /// A counter sample with a fractional value (e.g. `_seconds`).
    pub fn counter_f64(&mut self, name: &str, help: &str, labels: &[(&str, &str)], value: f64) {
        let value = if value.is_finite() && value >= 0.0 {
            value
        } else {
            0.0
        };
        self.add(name, help, labels, Value::CounterF(value));
    }

    /// A gauge sample.
    pub fn gauge(&mut self, name: &str, help: &str, labels: &[(&str, &str)], value: i64) {
        self.add(name, help, labels, Value::GaugeI(value));
    }

    /// A gauge sample with a fractional value.
    pub fn gauge_f64(&mut self, name: &str, help: &str, labels: &[(&str, &str)], value: f64) {
        self.add(name, help, labels, Value::GaugeF(value));
    }

    /// A histogram sample.
    pub fn histogram(&mut self, name: &str, help: &str, labels: &[(&str, &str)], h: Histogram) {
        self.add(name, help, labels, Value::Histogram(h));
    }

    /// Number of families.
    pub fn len(&self) -> usize {
        self.families.len()
    }

    /// Whether there is no family.
    pub fn is_empty(&self) -> bool {
        self.families.is_empty()
    }

    fn add(&mut self, name: &str, help: &str, labels: &[(&str, &str)], value: Value) {
        let mut name = sanitize_name(name);
        if value.kind() == Kind::Counter {
            if let Some(base) = name.strip_suffix("_total") {
                name = base.to_owned();
            }
        }
        let labels: Vec<(String, String)> = labels
            .iter()
            .map(|(k, v)| (sanitize_name(k), escape_label_value(v)))
            .collect();
        let i = match self.index.get(&name) {
            Some(&i) => i,
            None => {
                self.families.push(Family {
                    name: name.clone(),
                    help: escape_help(help),
                    kind: value.kind(),
                    samples: Vec::new(),
                });
                self.index.insert(name, self.families.len() - 1);
                self.families.len() - 1
            }
        };
        let f = &mut self.families[i];
        if f.kind != value.kind() {
            tracing::debug!(family = %f.name, "a sample of another type than its family's is left out");
            return;
        }
        match f.samples.iter_mut().find(|(l, _)| *l == labels) {
            // The same series twice: the last value wins (a family's series are distinct).
            Some(s) => s.1 = value,
            None => f.samples.push((labels, value)),
        }
    }

    /// The OpenMetrics text exposition (ends with `# EOF`).
    pub fn encode(&self) -> String {
        let mut registry = Registry::with_prefix(PREFIX);
        registry.register_collector(Box::new(Snapshot(self.families.clone())));
        let mut out = String::with_capacity(4096);
        if prometheus_client::encoding::text::encode(&mut out, &registry).is_err() {
            // Writing into a String does not fail; an encoder error is a bug, not a reason to
            // answer with half a page.
            tracing::warn!("the metrics could not be encoded");
            out.clear();
            out.push_str("# EOF\n");
        }
        out
    }
}

/// The families of one scrape, as `prometheus-client` sees them.
#[derive(Debug)]
struct Snapshot(Vec<Family>);

impl Collector for Snapshot {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        for f in &self.0 {
            if f.samples.is_empty() {
                continue;
            }
            let mut m = encoder.encode_descriptor(&f.name, &f.help, None, f.kind.metric_type())?;
            for (labels, value) in &f.samples {
                // No labels: no braces (`name 1`, not `name{} 1`).
                if labels.is_empty() {
                    encode_value(&mut m, value)?;
                } else {
                    encode_value(&mut m.encode_family(labels)?, value)?;
                }
            }
        }
        Ok(())
    }
}

fn encode_value(s: &mut MetricEncoder<'_>, value: &Value) -> Result<(), fmt::Error> {
    match value {
        Value::CounterU(v) => s.encode_counter::<NoLabelSet, _, u64>(v, None),
        Value::CounterF(v) => s.encode_counter::<NoLabelSet, _, f64>(v, None),
        Value::GaugeI(v) => s.encode_gauge(v),
        Value::GaugeF(v) => s.encode_gauge(v),
        Value::Histogram(h) => s.encode_histogram::<NoLabelSet>(h.sum, h.count, &h.buckets, None),
    }
}

/// A metric or label name as Prometheus allows it (`[a-zA-Z_][a-zA-Z0-9_]*`): other characters
/// become `_`, a leading digit gets a `_` in front, and an empty name becomes `_`.
pub fn sanitize_name(s: &str) -> String {
    let mut out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.is_empty() || out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    out
}

/// A label value escaped as the text format wants it: `\` `"` and line feeds.
fn escape_label_value(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// A help text escaped as the text format wants it: `\` and line feeds.
fn escape_help(s: &str) -> String {
    s.replace('\\', "\\\\").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_gauges_and_histograms_are_encoded_with_labels() {
        let mut m = Metrics::new();
        m.counter(
            "packets",
            "Packets a port handled.",
            &[("port", "inside"), ("direction", "rx")],
            7,
        );
        m.counter(
            "packets_total",
            "ignored help",
            &[("port", "outside"), ("direction", "tx")],
            5,
        );
        m.gauge("nf_sessions", "Sessions.", &[("nf", "nat")], -3);
        m.counter_f64("busy_seconds", "Busy time.", &[], 1.5);
        m.histogram(
            "batch_duration_seconds",
            "Batch time.",
            &[("worker", "0")],
            Histogram::from_log2(&[1, 2, 4, 0], 1e-6, 0.25),
        );
        let text = m.encode();
        assert!(
            text.contains("# TYPE flowstate_packets counter\n"),
            "{text}"
        );
        assert!(
            text.contains("flowstate_packets_total{port=\"inside\",direction=\"rx\"} 7\n"),
            "{text}"
        );
        assert!(
            text.contains("flowstate_packets_total{port=\"outside\",direction=\"tx\"} 5\n"),
            "{text}"
        );
        assert!(text.contains("# HELP flowstate_packets Packets a port handled.\n"));
        assert!(
            text.contains("flowstate_nf_sessions{nf=\"nat\"} -3\n"),
            "{text}"
        );
        assert!(
            text.contains("flowstate_busy_seconds_total 1.5\n"),
            "{text}"
        );
        for line in [
            "flowstate_batch_duration_seconds_bucket{le=\"0.000002\",worker=\"0\"} 3\n",
            "flowstate_batch_duration_seconds_bucket{le=\"0.000004\",worker=\"0\"} 7\n",
            "flowstate_batch_duration_seconds_bucket{le=\"+Inf\",worker=\"0\"} 7\n",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        assert!(text.contains("flowstate_batch_duration_seconds_count{worker=\"0\"} 7\n"));
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn label_values_and_names_are_escaped() {
        let mut m = Metrics::new();
        m.counter(
            "drops",
            "Drops\nby reason.",
            &[("nf", "fire\"wall"), ("reason", "a\\b\nc")],
            1,
        );
        m.gauge("9bad-name", "x", &[("bad key", "v")], 1);
        let text = m.encode();
        assert!(
            text.contains(r#"flowstate_drops_total{nf="fire\"wall",reason="a\\b\nc"} 1"#),
            "{text}"
        );
        assert!(text.contains("# HELP flowstate_drops Drops\\nby reason.\n"));
        assert!(
            text.contains("flowstate__9bad_name{bad_key=\"v\"} 1\n"),
            "{text}"
        );
    }

    #[test]
    fn a_sample_of_another_type_is_left_out_and_repeats_overwrite() {
        let mut m = Metrics::new();
        m.counter("x", "x", &[], 1);
        m.gauge("x", "x", &[], 2);
        m.counter("x", "x", &[], 3);
        let text = m.encode();
        assert!(text.contains("flowstate_x_total 3\n"), "{text}");
        assert!(!text.contains("flowstate_x 2"), "{text}");
        assert_eq!(m.len(), 1);
    }

    #[test]
    fn empty_metrics_are_just_eof() {
        assert_eq!(Metrics::new().encode(), "# EOF\n");
    }
}
