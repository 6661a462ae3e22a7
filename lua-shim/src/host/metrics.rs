//! The module's metrics, as the shim keeps them for this worker: what
//! `proxy_define_metric`, `proxy_increment_metric` and
//! `proxy_record_metric` do here, and the text `grpc.metrics()` reads.
//!
//! Histograms keep Prometheus buckets of the recorded values (the module
//! records milliseconds), so that `grpc.prometheus()` prints them as they
//! are. A name is defined once and keeps its id (Envoy's rule), so the
//! module, restarted after a trap, counts on where it left off.

use grpc_wasm::contract::{MetricType, ProxyStatus};
use rustc_hash::FxHashMap as HashMap;

/// The histograms' upper bounds (inclusive), in the unit recorded: the
/// module records milliseconds.
pub const BUCKETS: [u64; 14] = [
    1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000,
];

/// At most this many metrics (the module defines fewer, see
/// `grpc_wasm::contract::MAX_METRICS`), and names this long.
pub const MAX_METRICS: usize = grpc_wasm::contract::MAX_METRICS;
pub const MAX_NAME_BYTES: usize = 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Metric {
    name: String,
    kind: MetricType,
    value: i64,
    /// Histograms: the count in each of [`BUCKETS`] (not cumulative), then
    /// those above the last.
    buckets: Vec<u64>,
    sum: u64,
}

#[derive(Debug, Default)]
pub struct Metrics {
    metrics: Vec<Metric>,
    ids: HashMap<String, u32>,
}

impl Metrics {
    pub fn define(&mut self, kind: MetricType, name: &str) -> Result<u32, ProxyStatus> {
        if let Some(&id) = self.ids.get(name) {
            let same = self
                .metrics
                .get(id as usize)
                .is_some_and(|m| m.kind == kind);
            return if same {
                Ok(id)
            } else {
                Err(ProxyStatus::BadArgument)
            };
        }
        // The text format is one metric a line, fields between tabs.
        let printable = !name.contains(['\t', '\n']);
        if name.is_empty() || name.len() > MAX_NAME_BYTES || !printable {
            return Err(ProxyStatus::BadArgument);
        }
        if self.metrics.len() >= MAX_METRICS {
            return Err(ProxyStatus::InternalFailure);
        }
        let id = self.metrics.len() as u32;
        let buckets = match kind {
            MetricType::Histogram => vec![0; BUCKETS.len() + 1],
            _ => Vec::new(),
        };
        self.metrics.push(Metric {
            name: name.to_string(),
            kind,
            value: 0,
            buckets,
            sum: 0,
        });
        self.ids.insert(name.to_string(), id);
        Ok(id)
    }

    pub fn increment(&mut self, id: u32, offset: i64) -> Result<(), ProxyStatus> {
        let metric = self
            .metrics
            .get_mut(id as usize)
            .ok_or(ProxyStatus::NotFound)?;
        if metric.kind == MetricType::Histogram {
            return Err(ProxyStatus::BadArgument);
        }
        metric.value = metric.value.saturating_add(offset);
        Ok(())
    }

    pub fn record(&mut self, id: u32, value: u64) -> Result<(), ProxyStatus> {
        let metric = self
            .metrics
            .get_mut(id as usize)
            .ok_or(ProxyStatus::NotFound)?;
        match metric.kind {
            MetricType::Histogram => {
                let bucket = BUCKETS
                    .iter()
                    .position(|le| value <= *le)
                    .unwrap_or(BUCKETS.len());
                metric.buckets[bucket] += 1;
                metric.sum = metric.sum.saturating_add(value);
            }
            _ => metric.value = i64::try_from(value).unwrap_or(i64::MAX),
        }
        Ok(())
    }

    /// Every metric, a line each, fields between tabs: `c` (counter) or
    /// `g` (gauge), the name, the value; or `h`, the name, the count, the
    /// sum, and the cumulative count at each of [`BUCKETS`], comma
    /// separated.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for m in &self.metrics {
            match m.kind {
                MetricType::Counter => out.push_str(&format!("c\t{}\t{}\n", m.name, m.value)),
                MetricType::Gauge => out.push_str(&format!("g\t{}\t{}\n", m.name, m.value)),
                MetricType::Histogram => {
                    let mut cumulative = 0;
                    let counts: Vec<String> = m.buckets[..BUCKETS.len()]
                        .iter()
                        .map(|n| {
                            cumulative += n;
                            cumulative.to_string()
                        })
                        .collect();
                    let count: u64 = m.buckets.iter().sum();
                    out.push_str(&format!(
                        "h\t{}\t{count}\t{}\t{}\n",
                        m.name,
                        m.sum,
                        counts.join(",")
                    ));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lua_api_knows_the_same_buckets() {
        let lua = include_str!("../../lib/resty/ffi/grpc/metrics.lua");
        let line = lua
            .lines()
            .find_map(|l| l.strip_prefix("_M.BUCKETS_MS = {"))
            .expect("metrics.lua sets _M.BUCKETS_MS");
        let bounds: Vec<u64> = line
            .trim_end_matches('}')
            .split(',')
            .map(|b| b.trim().parse().expect("a bound"))
            .collect();
        assert_eq!(bounds, BUCKETS);
    }

    #[test]
    fn metrics_keep_their_ids_and_print_as_lines() {
        let mut m = Metrics::default();
        let c = m.define(MetricType::Counter, "calls;x=1").unwrap();
        let h = m.define(MetricType::Histogram, "ms").unwrap();
        let g = m.define(MetricType::Gauge, "held").unwrap();
        assert_eq!(m.define(MetricType::Counter, "calls;x=1"), Ok(c));
        assert_eq!(
            m.define(MetricType::Gauge, "calls;x=1"),
            Err(ProxyStatus::BadArgument)
        );
        assert_eq!(
            m.define(MetricType::Gauge, "a\tb"),
            Err(ProxyStatus::BadArgument)
        );
        m.increment(c, 2).unwrap();
        m.increment(c, 1).unwrap();
        m.record(g, 70).unwrap();
        for v in [0, 3, 3, 40_000] {
            m.record(h, v).unwrap();
        }
        assert_eq!(m.increment(h, 1), Err(ProxyStatus::BadArgument));
        assert_eq!(m.record(99, 1), Err(ProxyStatus::NotFound));
        assert_eq!(
            m.text(),
            "c\tcalls;x=1\t3\nh\tms\t4\t40006\t1,1,3,3,3,3,3,3,3,3,3,3,3,3\ng\theld\t70\n"
        );
    }

    #[test]
    fn definitions_stop_at_the_bound() {
        let mut m = Metrics::default();
        for i in 0..MAX_METRICS {
            m.define(MetricType::Counter, &format!("m{i}")).unwrap();
        }
        assert_eq!(
            m.define(MetricType::Counter, "one more"),
            Err(ProxyStatus::InternalFailure)
        );
        assert_eq!(m.define(MetricType::Counter, "m7"), Ok(7));
    }
}
