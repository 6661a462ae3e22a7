//! A proxy in memory, for driving the filter natively: it keeps the maps,
//! buffers and properties a test gives it, follows Envoy's rules where the
//! filter depends on them (buffer replacement, NotFound for what it does
//! not have), and records everything the filter asks of it.

use std::cell::RefCell;
use std::collections::HashMap;

use super::{GrpcCall, Host, HostStatus};
use crate::contract::pairs;
use crate::contract::{BufferType, ContextId, LogLevel, MapType, MetricType, ProxyStatus, Token};

const BAD_ARGUMENT: HostStatus = HostStatus(ProxyStatus::BadArgument as u32);

/// A header map in order; keys may repeat.
pub type Pairs = Vec<(String, Vec<u8>)>;

/// A local response the filter sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub http_status: u32,
    pub body: Vec<u8>,
    pub headers: Pairs,
}

/// A gRPC call or stream the filter opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrpcOpened {
    pub token: u32,
    pub upstream: Vec<u8>,
    pub service: String,
    pub method: String,
    pub metadata: Pairs,
    /// The request message of a unary call; `None` for a stream.
    pub message: Option<Vec<u8>>,
    pub timeout_ms: Option<u32>,
}

/// A metric the filter defined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metric {
    pub kind: MetricType,
    pub name: String,
    pub value: i64,
    pub recorded: Vec<u64>,
}

/// What a [`MockHost`] holds and what it saw.
#[derive(Debug, Default)]
pub struct MockState {
    pub maps: HashMap<MapType, Pairs>,
    pub buffers: HashMap<BufferType, Vec<u8>>,
    /// By path, segments joined with NUL.
    pub properties: HashMap<Vec<u8>, Vec<u8>>,
    /// Foreign functions the host has; calls to them are recorded.
    pub foreign_functions: Vec<String>,
    pub foreign_calls: Vec<(String, Vec<u8>)>,
    /// The status of the gRPC callback in progress.
    pub status: Option<(u32, Vec<u8>)>,
    pub now_nanos: u64,
    pub tick_ms: u32,
    pub effective_context: u32,
    pub logs: Vec<(LogLevel, String)>,
    pub replies: Vec<Reply>,
    pub opened: Vec<GrpcOpened>,
    pub sent: Vec<(u32, Vec<u8>)>,
    pub half_closed: Vec<u32>,
    pub cancelled: Vec<u32>,
    pub http_calls: Vec<(String, Pairs)>,
    /// Refuse local replies (InternalFailure), as a host may.
    pub refuse_replies: bool,
    /// The metrics defined, by id (their index): kind, name, the value of
    /// a counter or gauge, and every value recorded.
    pub metrics: Vec<Metric>,
    /// Refuse `proxy_define_metric`, as a host without metrics does.
    pub refuse_metrics: bool,
    /// Refuse new metric names with BadArgument, as a full host does.
    pub full_metrics: bool,
    /// Buffer reads the filter made: each is a host call, which costs a
    /// real proxy thousands of instructions.
    pub buffer_reads: u32,
    /// Every host call the filter made, by the trait's name for it.
    pub host_calls: std::collections::BTreeMap<&'static str, u32>,
    next_token: u32,
}

/// The mock proxy; tests keep an `Rc` to it to set its maps and read what
/// it recorded.
#[derive(Debug, Default)]
pub struct MockHost {
    pub state: RefCell<MockState>,
}

impl MockHost {
    fn count(&self, call: &'static str) {
        *self.state.borrow_mut().host_calls.entry(call).or_default() += 1;
    }

    /// Replaces a header map.
    pub fn set_map(&self, map: MapType, pairs: &[(&str, &str)]) {
        let pairs = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
            .collect();
        self.state.borrow_mut().maps.insert(map, pairs);
    }

    pub fn set_buffer_bytes(&self, kind: BufferType, bytes: &[u8]) {
        self.state.borrow_mut().buffers.insert(kind, bytes.to_vec());
    }

    pub fn map_value(&self, map: MapType, key: &str) -> Option<Vec<u8>> {
        let state = self.state.borrow();
        let pairs = state.maps.get(&map)?;
        pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
    }

    pub fn buffer_bytes(&self, kind: BufferType) -> Option<Vec<u8>> {
        self.state.borrow().buffers.get(&kind).cloned()
    }

    /// The metric named `name`, if the filter defined it.
    pub fn metric(&self, name: &str) -> Option<Metric> {
        let state = self.state.borrow();
        state.metrics.iter().find(|m| m.name == name).cloned()
    }

    fn token(&self) -> u32 {
        let mut state = self.state.borrow_mut();
        state.next_token += 1;
        state.next_token
    }

    fn open(&self, call: &GrpcCall, message: Option<&[u8]>, timeout_ms: Option<u32>) -> u32 {
        let token = self.token();
        let metadata = pairs::deserialize(call.metadata).unwrap_or_default();
        self.state.borrow_mut().opened.push(GrpcOpened {
            token,
            upstream: call.upstream.to_vec(),
            service: call.service.to_string(),
            method: call.method.to_string(),
            metadata,
            message: message.map(<[u8]>::to_vec),
            timeout_ms,
        });
        token
    }
}

impl Host for MockHost {
    fn log(&self, level: LogLevel, message: &str) {
        self.count("log");
        self.state
            .borrow_mut()
            .logs
            .push((level, message.to_string()));
    }

    fn get_buffer(
        &self,
        kind: BufferType,
        start: usize,
        max: usize,
    ) -> Result<Vec<u8>, HostStatus> {
        self.count("get_buffer");
        self.state.borrow_mut().buffer_reads += 1;
        let state = self.state.borrow();
        let buffer = state.buffers.get(&kind).ok_or(HostStatus::NOT_FOUND)?;
        let start = start.min(buffer.len());
        let end = start.saturating_add(max).min(buffer.len());
        Ok(buffer[start..end].to_vec())
    }

    fn set_buffer(
        &self,
        kind: BufferType,
        start: usize,
        size: usize,
        data: &[u8],
    ) -> Result<(), HostStatus> {
        self.count("set_buffer");
        let mut state = self.state.borrow_mut();
        let buffer = state.buffers.get_mut(&kind).ok_or(HostStatus::NOT_FOUND)?;
        if start == 0 {
            buffer.drain(..size.min(buffer.len()));
            buffer.splice(0..0, data.iter().copied());
        } else if start >= buffer.len() {
            buffer.extend_from_slice(data);
        } else {
            return Err(BAD_ARGUMENT);
        }
        Ok(())
    }

    fn get_header_pairs(&self, map: MapType) -> Result<Vec<u8>, HostStatus> {
        self.count("get_header_pairs");
        let state = self.state.borrow();
        let pairs = state.maps.get(&map).ok_or(HostStatus::NOT_FOUND)?;
        let pairs: Vec<(&str, &[u8])> = pairs
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_slice()))
            .collect();
        Ok(pairs::serialize(&pairs))
    }

    fn replace_header(&self, map: MapType, key: &str, value: &str) -> Result<(), HostStatus> {
        self.count("replace_header");
        let mut state = self.state.borrow_mut();
        let pairs = state.maps.get_mut(&map).ok_or(HostStatus::NOT_FOUND)?;
        pairs.retain(|(k, _)| k != key);
        pairs.push((key.to_string(), value.as_bytes().to_vec()));
        Ok(())
    }

    fn remove_header(&self, map: MapType, key: &str) -> Result<(), HostStatus> {
        self.count("remove_header");
        let mut state = self.state.borrow_mut();
        let pairs = state.maps.get_mut(&map).ok_or(HostStatus::NOT_FOUND)?;
        pairs.retain(|(k, _)| k != key);
        Ok(())
    }

    fn set_tick_period(&self, period_ms: u32) -> Result<(), HostStatus> {
        self.count("set_tick_period");
        self.state.borrow_mut().tick_ms = period_ms;
        Ok(())
    }

    fn current_time_nanos(&self) -> u64 {
        self.count("current_time_nanos");
        self.state.borrow().now_nanos
    }

    fn get_property(&self, path: &[u8]) -> Result<Vec<u8>, HostStatus> {
        self.count("get_property");
        let state = self.state.borrow();
        state
            .properties
            .get(path)
            .cloned()
            .ok_or(HostStatus::NOT_FOUND)
    }

    fn set_effective_context(&self, context_id: ContextId) -> Result<(), HostStatus> {
        self.count("set_effective_context");
        self.state.borrow_mut().effective_context = context_id.0;
        Ok(())
    }

    fn call_foreign(&self, name: &str, args: &[u8]) -> Result<Vec<u8>, HostStatus> {
        self.count("call_foreign");
        let mut state = self.state.borrow_mut();
        if !state.foreign_functions.iter().any(|f| f == name) {
            return Err(HostStatus::NOT_FOUND);
        }
        state.foreign_calls.push((name.to_string(), args.to_vec()));
        Ok(Vec::new())
    }

    fn http_call(
        &self,
        upstream: &str,
        headers: &[u8],
        _trailers: &[u8],
        _timeout_ms: u32,
    ) -> Result<Token, HostStatus> {
        self.count("http_call");
        let headers = pairs::deserialize(headers).unwrap_or_default();
        let token = self.token();
        self.state
            .borrow_mut()
            .http_calls
            .push((upstream.to_string(), headers));
        Ok(Token(token))
    }

    fn grpc_call(
        &self,
        call: &GrpcCall,
        message: &[u8],
        timeout_ms: u32,
    ) -> Result<Token, HostStatus> {
        self.count("grpc_call");
        Ok(Token(self.open(call, Some(message), Some(timeout_ms))))
    }

    fn grpc_stream(&self, call: &GrpcCall) -> Result<Token, HostStatus> {
        self.count("grpc_stream");
        Ok(Token(self.open(call, None, None)))
    }

    fn grpc_send(&self, token: Token, message: &[u8]) -> Result<(), HostStatus> {
        self.count("grpc_send");
        self.state
            .borrow_mut()
            .sent
            .push((token.0, message.to_vec()));
        Ok(())
    }

    fn grpc_close(&self, token: Token) -> Result<(), HostStatus> {
        self.count("grpc_close");
        self.state.borrow_mut().half_closed.push(token.0);
        Ok(())
    }

    fn grpc_cancel(&self, token: Token) -> Result<(), HostStatus> {
        self.count("grpc_cancel");
        self.state.borrow_mut().cancelled.push(token.0);
        Ok(())
    }

    fn get_status(&self) -> Result<(u32, Vec<u8>), HostStatus> {
        self.count("get_status");
        self.state
            .borrow()
            .status
            .clone()
            .ok_or(HostStatus::NOT_FOUND)
    }

    fn send_local_response(
        &self,
        http_status: u32,
        _details: &str,
        body: &[u8],
        headers: &[u8],
    ) -> Result<(), HostStatus> {
        self.count("send_local_response");
        if self.state.borrow().refuse_replies {
            return Err(HostStatus(ProxyStatus::InternalFailure as u32));
        }
        let headers = pairs::deserialize(headers).unwrap_or_default();
        self.state.borrow_mut().replies.push(Reply {
            http_status,
            body: body.to_vec(),
            headers,
        });
        Ok(())
    }

    fn define_metric(&self, kind: MetricType, name: &str) -> Result<u32, HostStatus> {
        self.count("define_metric");
        let mut state = self.state.borrow_mut();
        if state.refuse_metrics {
            return Err(HostStatus(ProxyStatus::Unimplemented as u32));
        }
        // Envoy answers the same id for a name defined again.
        if let Some(id) = state.metrics.iter().position(|m| m.name == name) {
            return Ok(id as u32);
        }
        if state.full_metrics {
            return Err(BAD_ARGUMENT);
        }
        state.metrics.push(Metric {
            kind,
            name: name.to_string(),
            value: 0,
            recorded: Vec::new(),
        });
        Ok(state.metrics.len() as u32 - 1)
    }

    fn increment_metric(&self, id: u32, offset: i64) -> Result<(), HostStatus> {
        self.count("increment_metric");
        let mut state = self.state.borrow_mut();
        let metric = state
            .metrics
            .get_mut(id as usize)
            .ok_or(HostStatus::NOT_FOUND)?;
        if metric.kind == MetricType::Histogram {
            return Err(BAD_ARGUMENT);
        }
        metric.value += offset;
        Ok(())
    }

    fn record_metric(&self, id: u32, value: u64) -> Result<(), HostStatus> {
        self.count("record_metric");
        let mut state = self.state.borrow_mut();
        let metric = state
            .metrics
            .get_mut(id as usize)
            .ok_or(HostStatus::NOT_FOUND)?;
        if metric.kind != MetricType::Histogram {
            metric.value = i64::try_from(value).map_err(|_| BAD_ARGUMENT)?;
        }
        metric.recorded.push(value);
        Ok(())
    }
}
