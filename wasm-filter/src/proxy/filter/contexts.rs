//! The context maps: one root context per plugin configuration, one
//! stream per HTTP exchange.

use std::cell::RefCell;
use std::rc::Rc;

use super::super::config::FilterConfig;
use super::super::id_map::IdMap;
use super::stream::Stream;
use crate::contract::ContextId;

thread_local! {
    pub(super) static ROOTS: RefCell<IdMap<ContextId, Rc<FilterConfig>>> = RefCell::new(IdMap::default());
    /// Shared cells: a callback borrows its stream in place, and a re-entrant
    /// callback for the same stream finds it borrowed and does nothing.
    pub(super) static STREAMS: RefCell<IdMap<ContextId, Rc<RefCell<Stream>>>> = RefCell::new(IdMap::default());
}

pub(super) fn with_stream(
    context_id: ContextId,
    default: u32,
    f: impl FnOnce(&mut Stream) -> u32,
) -> u32 {
    let Some(cell) = STREAMS.with(|s| s.borrow().get(&context_id).cloned()) else {
        return default;
    };
    // Borrowed already: a host call made from this stream's own callback
    // (a local reply) re-entered the module.
    let Ok(mut stream) = cell.try_borrow_mut() else {
        return default;
    };
    f(&mut stream)
}
