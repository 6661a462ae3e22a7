//! The filter's metrics, through the proxy-wasm metrics ABI
//! (`proxy_define_metric`, `proxy_increment_metric`, `proxy_record_metric`).
//!
//! The ABI has no labels, only a name, so the labels are written into it
//! as `;label=value` segments after the metric's name:
//! `grpc_client_handled_total;grpc_service=echo.Echo;grpc_method=Unary;grpc_code=OK`.
//! A host turns them into labels with one pattern per label: Envoy's
//! `stats_tags` (`(;grpc_service=([^;]*))`), the OpenResty shim's
//! `grpc.prometheus()` itself. The names follow go-grpc-prometheus
//! (`grpc_client_*`), which dashboards already chart; docs/operating.md maps
//! them to gRFC A66's.
//!
//! Metrics are defined on first use, per method and code: the calls the
//! filter makes are those of its configured methods, so the names are
//! bounded by the configuration, and [`MAX_METRICS`] bounds them in any
//! case. A host that refuses a definition (one without metrics) turns
//! them off for the VM with one log line; the filter serves on.
//!
//! Counters are added up in the module and handed to the host at each
//! tick ([`flush`], every `TICK_MS`), in one host call per counter that
//! moved: a host call costs Envoy about a thousand instructions, and a
//! request moves six counters. A scrape sees them at most a tick late.
//! The latency histogram takes each sample as it comes.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

use crate::code::Code;

use super::host;
use crate::contract::{LogLevel, MetricType};

pub use crate::contract::MAX_METRICS;

/// The gauges change in steps of this many bytes at least, so that a
/// stream's small response does not cost a host call each time it is held
/// and given back.
pub const HELD_GAUGE_STEP: usize = 64 << 10;

/// A metric's slot: not defined yet, the host's id, or not to be defined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Undefined,
    Id(u32),
    Off,
}

/// What a call's metrics count, per method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Counter {
    Started,
    MessagesSent,
    MessagesReceived,
    BytesSent,
    BytesReceived,
}

impl Counter {
    const ALL: [Counter; 5] = [
        Counter::Started,
        Counter::MessagesSent,
        Counter::MessagesReceived,
        Counter::BytesSent,
        Counter::BytesReceived,
    ];

    fn name(self) -> &'static str {
        match self {
            Counter::Started => "grpc_client_started_total",
            Counter::MessagesSent => "grpc_client_msg_sent_total",
            Counter::MessagesReceived => "grpc_client_msg_received_total",
            Counter::BytesSent => "grpc_client_msg_sent_bytes_total",
            Counter::BytesReceived => "grpc_client_msg_received_bytes_total",
        }
    }
}

/// Why the filter itself answered an error: the request could not become
/// a gRPC request, or the response could not become the client's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    Request,
    Response,
}

impl Cause {
    fn label(self) -> &'static str {
        match self {
            Cause::Request => "request",
            Cause::Response => "response",
        }
    }
}

const HANDLED: &str = "grpc_client_handled_total";
const DURATION: &str = "grpc_client_handling_milliseconds";
const FAILURES: &str = "grpc_wasm_transcode_failures_total";
const HELD_BYTES: &str = "grpc_wasm_held_bytes";
const DESCRIPTOR_FILES: &str = "grpc_wasm_descriptor_files";

/// A counter: its host id (once defined) and what it counted since the
/// last [`flush`].
#[derive(Debug)]
struct CounterSlot {
    slot: Cell<Slot>,
    pending: Cell<u64>,
}

impl CounterSlot {
    fn new() -> Self {
        CounterSlot {
            slot: Cell::new(Slot::Undefined),
            pending: Cell::new(0),
        }
    }

    /// Hands what it counted to the host.
    fn flush(&self, name: impl FnOnce() -> String) {
        let n = self.pending.take();
        if n == 0 {
            return;
        }
        if let Some(id) = id(&self.slot, MetricType::Counter, name) {
            let _ = host::increment_metric(id, i64::try_from(n).unwrap_or(i64::MAX));
        }
    }
}

/// The metrics of one method, defined as they are first used.
#[derive(Debug)]
pub struct MethodMetrics {
    /// `;grpc_service=…;grpc_method=…`
    labels: String,
    counters: [CounterSlot; 5],
    handled: [CounterSlot; 17],
    failures: [CounterSlot; 2],
    duration: Cell<Slot>,
    /// On the registry's list of methods to flush.
    dirty: Cell<bool>,
}

impl MethodMetrics {
    fn new(service: &str, method: &str) -> Self {
        let undefined = || Cell::new(Slot::Undefined);
        MethodMetrics {
            labels: format!(
                ";grpc_service={};grpc_method={}",
                label_value(service),
                label_value(method)
            ),
            counters: std::array::from_fn(|_| CounterSlot::new()),
            handled: std::array::from_fn(|_| CounterSlot::new()),
            failures: std::array::from_fn(|_| CounterSlot::new()),
            duration: undefined(),
            dirty: Cell::new(false),
        }
    }

    fn add(self: &Rc<Self>, counter: Counter, n: u64) {
        let index = Counter::ALL.iter().position(|c| *c == counter).unwrap_or(0);
        self.count(&self.counters[index], n);
    }

    /// Counts `n` on `slot`, for the next flush.
    fn count(self: &Rc<Self>, slot: &CounterSlot, n: u64) {
        if n == 0 {
            return;
        }
        slot.pending.set(slot.pending.get().saturating_add(n));
        if !self.dirty.replace(true) {
            REGISTRY.with(|r| r.borrow_mut().dirty.push(self.clone()));
        }
    }

    fn flush(&self) {
        self.dirty.set(false);
        for (counter, slot) in Counter::ALL.iter().zip(&self.counters) {
            slot.flush(|| format!("{}{}", counter.name(), self.labels));
        }
        for (code, slot) in (0..).map(Code::from_i32).zip(&self.handled) {
            slot.flush(|| format!("{HANDLED}{};grpc_code={}", self.labels, code.name()));
        }
        for (cause, slot) in [Cause::Request, Cause::Response].iter().zip(&self.failures) {
            slot.flush(|| format!("{FAILURES}{};cause={}", self.labels, cause.label()));
        }
    }
}

/// Hands every counter that moved since the last flush to the host (at
/// each tick).
pub fn flush() {
    let dirty = REGISTRY.with(|r| std::mem::take(&mut r.borrow_mut().dirty));
    for method in dirty {
        method.flush();
    }
}

/// Whether metrics are on (then the filter's ticks run, to flush them).
pub fn are_on() -> bool {
    REGISTRY.with(|r| !r.borrow().off)
}

/// A label's value as a name may hold it: a descriptor set is not checked
/// as `.proto` text is, and a `;` or `=` in a name would forge a label.
fn label_value(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[derive(Default)]
struct Registry {
    /// Off for the VM: the host refused a definition, or has no metrics.
    off: bool,
    defined: usize,
    /// Logged that [`MAX_METRICS`] was reached.
    full: bool,
    methods: HashMap<String, Rc<MethodMetrics>>,
    /// Methods whose counters moved since the last flush.
    dirty: Vec<Rc<MethodMetrics>>,
    held: Cell<Option<(Slot, usize)>>,
    descriptor_files: Cell<Option<Slot>>,
}

thread_local! {
    static REGISTRY: RefCell<Registry> = RefCell::new(Registry::default());
}

/// A new configuration: the methods of the old one are forgotten, and the
/// bound counts afresh (a host keeps what it defined, and gives the same
/// id for a name defined again).
pub fn reconfigured() {
    REGISTRY.with(|r| {
        let mut r = r.borrow_mut();
        r.methods.clear();
        r.defined = 0;
        r.full = false;
    });
}

/// Turns the metrics off for this VM, with one log line saying why (a
/// host whose definitions would trap, or that nothing reads).
pub fn turn_off(why: &str) {
    let was_off = REGISTRY.with(|r| std::mem::replace(&mut r.borrow_mut().off, true));
    if !was_off {
        host::log(LogLevel::Info, &format!("grpc-wasm: no metrics: {why}"));
    }
}

/// The metrics of `service`/`method` (`path` is `/service/method`).
pub fn of_method(path: &str, service: &str, method: &str) -> Rc<MethodMetrics> {
    REGISTRY.with(|r| {
        let mut r = r.borrow_mut();
        if let Some(m) = r.methods.get(path) {
            return m.clone();
        }
        let m = Rc::new(MethodMetrics::new(service, method));
        // Paths come from the configuration's descriptors: bounded, and
        // past MAX_METRICS nothing new is defined anyway.
        if r.methods.len() < MAX_METRICS {
            r.methods.insert(path.to_string(), m.clone());
        }
        m
    })
}

/// The slot's id, defining the metric on first use; `None` when metrics
/// are off or the host refused it.
fn id(slot: &Cell<Slot>, kind: MetricType, name: impl FnOnce() -> String) -> Option<u32> {
    match slot.get() {
        Slot::Id(id) => return Some(id),
        Slot::Off => return None,
        Slot::Undefined => {}
    }
    let allowed = REGISTRY.with(|r| {
        let mut r = r.borrow_mut();
        if r.off {
            return false;
        }
        if r.defined >= MAX_METRICS {
            if !r.full {
                r.full = true;
                host::log(
                    LogLevel::Warn,
                    &format!("grpc-wasm: {MAX_METRICS} metrics are defined; no more will be"),
                );
            }
            return false;
        }
        r.defined += 1;
        true
    });
    if !allowed {
        slot.set(Slot::Off);
        return None;
    }
    let name = name();
    match host::define_metric(kind, &name) {
        Ok(id) => {
            slot.set(Slot::Id(id));
            Some(id)
        }
        // A host without the function turns every metric off; a refusal
        // of one name (too long, the host full) only that one.
        Err(status) if lacks_metrics(status) => {
            slot.set(Slot::Off);
            turn_off(&format!(
                "the host refused to define {name} (host status {})",
                status.0
            ));
            None
        }
        Err(status) => {
            slot.set(Slot::Off);
            host::log(
                LogLevel::Warn,
                &format!(
                    "grpc-wasm: the host refused the metric {name} (host status {})",
                    status.0
                ),
            );
            None
        }
    }
}

fn lacks_metrics(status: host::HostStatus) -> bool {
    use crate::contract::ProxyStatus;
    [ProxyStatus::Unimplemented, ProxyStatus::NotFound]
        .iter()
        .any(|s| status.0 == *s as u32)
}

fn record(slot: &Cell<Slot>, kind: MetricType, name: impl FnOnce() -> String, value: u64) {
    if let Some(id) = id(slot, kind, name) {
        let _ = host::record_metric(id, value);
    }
}

/// One call's metrics: started when made, ended once with its code.
#[derive(Debug, Default)]
pub struct Meter {
    method: Option<Rc<MethodMetrics>>,
    started_ns: u64,
    /// The request left for the upstream: a failure after it is the
    /// response's.
    sent: bool,
    ended: bool,
}

impl Meter {
    /// Counts the call as started, now.
    pub fn start(&mut self, metrics: Rc<MethodMetrics>) {
        if REGISTRY.with(|r| r.borrow().off) {
            return;
        }
        metrics.add(Counter::Started, 1);
        self.started_ns = host::now_nanos();
        self.method = Some(metrics);
    }

    /// Request messages that left for the upstream, `bytes` in all.
    pub fn sent(&mut self, messages: u64, bytes: usize) {
        self.sent = true;
        if let Some(m) = &self.method {
            m.add(Counter::MessagesSent, messages);
            m.add(Counter::BytesSent, bytes as u64);
        }
    }

    /// Whether the request left for the upstream.
    pub fn has_sent(&self) -> bool {
        self.sent
    }

    /// Response messages from the upstream, `bytes` in all.
    pub fn received(&mut self, messages: u64, bytes: usize) {
        if let Some(m) = &self.method {
            m.add(Counter::MessagesReceived, messages);
            m.add(Counter::BytesReceived, bytes as u64);
        }
    }

    /// Ends the call with `code`, once: what follows an end does not
    /// change it. `failure`: the filter's own answer, and why.
    pub fn end(&mut self, code: Code, failure: Option<Cause>) {
        if std::mem::replace(&mut self.ended, true) {
            return;
        }
        let Some(m) = &self.method else {
            return;
        };
        let index = usize::try_from(code.as_i32()).unwrap_or(2).min(16);
        m.count(&m.handled[index], 1);
        if let Some(cause) = failure {
            m.count(&m.failures[cause as usize], 1);
        }
        let elapsed_ms = host::now_nanos().saturating_sub(self.started_ns) / 1_000_000;
        let name = || format!("{DURATION}{}", m.labels);
        record(&m.duration, MetricType::Histogram, name, elapsed_ms);
    }

    /// A call that ends without an end (the client went away, or the host
    /// dropped the stream) ends CANCELLED.
    pub fn drop_unended(&mut self) {
        self.end(Code::Cancelled, None);
    }
}

/// Records the bytes the VM's streams hold, when they moved by
/// [`HELD_GAUGE_STEP`] or reached zero since the last record.
pub fn held_bytes(total: usize) {
    REGISTRY.with(|r| {
        let r = r.borrow();
        if r.off {
            return;
        }
        let (slot, last) = r.held.get().unwrap_or((Slot::Undefined, 0));
        let moved = total.abs_diff(last) >= HELD_GAUGE_STEP || (total == 0 && last != 0);
        if slot != Slot::Undefined && !moved {
            return;
        }
        drop(r);
        let cell = Cell::new(slot);
        record(
            &cell,
            MetricType::Gauge,
            || HELD_BYTES.to_string(),
            total as u64,
        );
        REGISTRY.with(|r| r.borrow().held.set(Some((cell.get(), total))));
    });
}

/// Records how many descriptor files the configuration loaded.
pub fn descriptor_files(count: usize) {
    let slot = REGISTRY.with(|r| {
        let r = r.borrow();
        (!r.off).then(|| r.descriptor_files.get().unwrap_or(Slot::Undefined))
    });
    let Some(slot) = slot else {
        return;
    };
    let cell = Cell::new(slot);
    let name = || DESCRIPTOR_FILES.to_string();
    record(&cell, MetricType::Gauge, name, count as u64);
    REGISTRY.with(|r| r.borrow().descriptor_files.set(Some(cell.get())));
}

/// How many gRPC frames `bytes` holds, complete or not, from their
/// headers alone: the request messages a transcoded body became.
pub fn frames_in(bytes: &[u8]) -> u64 {
    let mut at = 0usize;
    let mut count = 0;
    while let Some(header) = bytes.get(at..at + 5) {
        let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]);
        count += 1;
        at = at.saturating_add(5).saturating_add(len as usize);
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::host::mock::MockHost;

    fn with_mock() -> Rc<MockHost> {
        REGISTRY.with(|r| *r.borrow_mut() = Registry::default());
        let mock = Rc::new(MockHost::default());
        host::install(mock.clone());
        mock
    }

    #[test]
    fn a_call_counts_once_with_its_code_and_duration() {
        let mock = with_mock();
        let m = of_method("/echo.Echo/Unary", "echo.Echo", "Unary");
        let mut meter = Meter::default();
        mock.state.borrow_mut().now_nanos = 5_000_000;
        meter.start(m.clone());
        meter.sent(1, 7);
        meter.received(2, 30);
        mock.state.borrow_mut().now_nanos = 47_000_000;
        meter.end(Code::NotFound, None);
        meter.end(Code::Ok, None);
        meter.drop_unended();
        // Counters reach the host at the next flush (a tick).
        assert!(mock
            .state
            .borrow()
            .metrics
            .iter()
            .all(|m| m.kind == MetricType::Histogram));
        flush();
        let labels = ";grpc_service=echo.Echo;grpc_method=Unary";
        let value = |name: &str| mock.metric(&format!("{name}{labels}")).map(|m| m.value);
        assert_eq!(value("grpc_client_started_total"), Some(1));
        assert_eq!(value("grpc_client_msg_sent_total"), Some(1));
        assert_eq!(value("grpc_client_msg_sent_bytes_total"), Some(7));
        assert_eq!(value("grpc_client_msg_received_total"), Some(2));
        assert_eq!(value("grpc_client_msg_received_bytes_total"), Some(30));
        assert_eq!(
            value("grpc_client_handled_total").map(|_| ()),
            None,
            "handled has a code label"
        );
        let handled = mock
            .metric(&format!(
                "grpc_client_handled_total{labels};grpc_code=NOT_FOUND"
            ))
            .unwrap();
        assert_eq!((handled.kind, handled.value), (MetricType::Counter, 1));
        assert!(mock
            .metric(&format!("grpc_client_handled_total{labels};grpc_code=OK"))
            .is_none());
        let duration = mock
            .metric(&format!("grpc_client_handling_milliseconds{labels}"))
            .unwrap();
        assert_eq!(
            (duration.kind, duration.recorded),
            (MetricType::Histogram, vec![42])
        );
        // The second call reuses every id.
        let defined = mock.state.borrow().metrics.len();
        let mut again = Meter::default();
        again.start(of_method("/echo.Echo/Unary", "echo.Echo", "Unary"));
        again.end(Code::NotFound, Some(Cause::Request));
        flush();
        assert_eq!(value("grpc_client_started_total"), Some(2));
        assert_eq!(mock.state.borrow().metrics.len(), defined + 1);
        assert_eq!(
            mock.metric(&format!(
                "grpc_wasm_transcode_failures_total{labels};cause=request"
            ))
            .map(|m| m.value),
            Some(1)
        );
    }

    #[test]
    fn a_host_that_refuses_metrics_turns_them_off_with_one_log_line() {
        let mock = with_mock();
        mock.state.borrow_mut().refuse_metrics = true;
        for _ in 0..3 {
            let mut meter = Meter::default();
            meter.start(of_method("/a.B/C", "a.B", "C"));
            meter.end(Code::Ok, None);
        }
        flush();
        held_bytes(1 << 20);
        let logs = mock.state.borrow().logs.clone();
        assert_eq!(logs.len(), 1, "{logs:?}");
        assert!(logs[0].1.starts_with(
            "grpc-wasm: no metrics: the host refused to define grpc_client_handling_milliseconds;grpc_service=a.B;grpc_method=C (host status 12)"
        ));
        assert!(mock.state.borrow().metrics.is_empty());
    }

    #[test]
    fn names_cannot_forge_labels_and_one_refused_name_stops_only_itself() {
        let mock = with_mock();
        let m = of_method("/a.B/C", "a;grpc_code=OK", "C=1");
        let mut meter = Meter::default();
        meter.start(m);
        flush();
        assert!(mock
            .metric("grpc_client_started_total;grpc_service=a_grpc_code_OK;grpc_method=C_1")
            .is_some());
        // The host refuses one name (as the shim refuses a long one): that
        // metric stays off, the others count on.
        mock.state.borrow_mut().full_metrics = true;
        meter.end(Code::Ok, None);
        flush();
        mock.state.borrow_mut().full_metrics = false;
        assert!(mock
            .metric("grpc_client_handled_total;grpc_service=a_grpc_code_OK;grpc_method=C_1;grpc_code=OK")
            .is_none());
        let mut again = Meter::default();
        again.start(of_method("/a.B/C", "a;grpc_code=OK", "C=1"));
        flush();
        let started = mock
            .metric("grpc_client_started_total;grpc_service=a_grpc_code_OK;grpc_method=C_1")
            .unwrap();
        assert_eq!(started.value, 2);
    }

    #[test]
    fn the_held_gauge_moves_in_steps() {
        let mock = with_mock();
        for total in [100, 200, HELD_GAUGE_STEP + 100, HELD_GAUGE_STEP + 300, 0, 0] {
            held_bytes(total);
        }
        let gauge = mock.metric("grpc_wasm_held_bytes").unwrap();
        assert_eq!(gauge.kind, MetricType::Gauge);
        assert_eq!(gauge.recorded, [100, HELD_GAUGE_STEP as u64 + 100, 0]);
    }

    #[test]
    fn frames_are_counted_from_their_headers() {
        assert_eq!(frames_in(b""), 0);
        assert_eq!(frames_in(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 9]), 2);
        assert_eq!(frames_in(&[0, 0, 0, 0, 9, 1]), 1);
    }
}
