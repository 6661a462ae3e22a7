//! What printing from the wire needs of a message type, worked out once
//! per type and kept with its pool: descriptor look-ups (a field by its
//! number, its kind, whether it is a map) cost more than reading the bytes
//! themselves. A list of small messages paid them for every element
//! (about 130 ms per MiB of two-int messages), then every reply
//! paid them once per type it printed (a third of printing a one-book
//! `ListBooksResponse`).

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use prost::encoding::WireType;
use prost_reflect::{DescriptorPool, FieldDescriptor, Kind, MessageDescriptor};

use super::quote::quote_into;
use crate::json::WellKnown;

/// How one field's values lie on the wire.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    /// The wire type of one value (length-delimited for strings, bytes,
    /// messages and map entries).
    pub(crate) wire: WireType,
    pub(crate) group: bool,
    pub(crate) map: bool,
    pub(crate) list: bool,
    /// A scalar other than a string or bytes, which a list may pack.
    pub(crate) packable: bool,
    pub(crate) string: bool,
    pub(crate) message: bool,
    /// Whether the field is printed when it holds its default.
    pub(crate) presence: bool,
}

impl Shape {
    pub(crate) fn of(field: &FieldDescriptor) -> Shape {
        let kind = field.kind();
        // Messages and map entries are length-delimited too.
        let wire = wire_type_of(&kind).unwrap_or(WireType::LengthDelimited);
        Shape {
            wire,
            group: field.is_group(),
            map: field.is_map(),
            list: field.is_list(),
            packable: !matches!(kind, Kind::String | Kind::Bytes | Kind::Message(_)),
            string: kind == Kind::String,
            message: matches!(kind, Kind::Message(_)),
            presence: field.supports_presence(),
        }
    }
}

/// A message type's fields in number order (as `MessageDescriptor::fields`
/// lists them, and JSON prints them), with their shapes.
pub(crate) struct Layout {
    pub(crate) well_known: Option<WellKnown>,
    /// Whether the type has extension ranges (an extension is for the
    /// general path).
    pub(crate) extensions: bool,
    pub(crate) numbers: Vec<u32>,
    pub(crate) fields: Vec<FieldDescriptor>,
    pub(crate) shapes: Vec<Shape>,
    pub(crate) kinds: Vec<Kind>,
    /// Each field's key as the JSON writes it, quoted, with its colon.
    pub(crate) keys: Vec<Box<str>>,
    /// Every field a singular scalar outside any oneof: the last
    /// occurrence of each is all that counts (a Point, a Timestamp).
    pub(crate) singular: bool,
    /// Per field, the fewest JSON bytes each occurrence prints when the
    /// field is a list (0 where an occurrence may print nothing: a packed
    /// run of scalars may be empty); all 0 when there is no such list.
    pub(crate) least_per_item: Vec<usize>,
    /// A Timestamp or Duration as google/protobuf declares it: `int64
    /// seconds = 1; int32 nanos = 2;` (read without the layout, see
    /// `json::wire`).
    pub(crate) plain_time: bool,
}

impl Layout {
    /// `proto_names`: keys are the `.proto` names, not lowerCamelCase.
    pub(crate) fn new(desc: &MessageDescriptor, proto_names: bool) -> Layout {
        let fields: Vec<FieldDescriptor> = desc.fields().collect();
        let key = |field: &FieldDescriptor| {
            let mut key = String::new();
            quote_into(
                &mut key,
                if proto_names {
                    field.name()
                } else {
                    field.json_name()
                },
            );
            key.push(':');
            key.into_boxed_str()
        };
        let shapes: Vec<Shape> = fields.iter().map(Shape::of).collect();
        let singular = desc.oneofs().len() == 0
            && shapes
                .iter()
                .all(|s| !s.list && !s.map && !s.message && !s.group);
        let least_per_item: Vec<usize> = fields.iter().map(least_per_item).collect();
        let well_known = WellKnown::of(desc);
        let kinds: Vec<Kind> = fields.iter().map(FieldDescriptor::kind).collect();
        let plain_time = matches!(well_known, Some(WellKnown::Timestamp | WellKnown::Duration))
            && fields.iter().map(FieldDescriptor::number).eq([1, 2])
            && kinds == [Kind::Int64, Kind::Int32];
        Layout {
            least_per_item,
            plain_time,
            well_known,
            extensions: desc.extension_ranges().len() > 0,
            numbers: fields.iter().map(FieldDescriptor::number).collect(),
            shapes,
            kinds,
            keys: fields.iter().map(key).collect(),
            fields,
            singular,
        }
    }

    /// A field's place in [`Layout::fields`].
    pub(crate) fn position(&self, number: u32) -> Option<usize> {
        // Most messages number their fields 1, 2, 3…: then a field's
        // number tells its place.
        let dense = (number as usize).wrapping_sub(1);
        if self.numbers.get(dense) == Some(&number) {
            return Some(dense);
        }
        self.numbers.binary_search(&number).ok()
    }
}

/// The fewest JSON bytes one occurrence of a list field prints.
fn least_per_item(field: &FieldDescriptor) -> usize {
    if !field.is_list() {
        return 0;
    }
    match field.kind() {
        Kind::String | Kind::Bytes => 2,
        Kind::Message(inner) => match WellKnown::of(&inner) {
            // "1970-01-01T00:00:00Z" and its quotes: years have 4 digits.
            Some(WellKnown::Timestamp) => 22,
            // "0s"
            Some(WellKnown::Duration) => 4,
            Some(WellKnown::Value | WellKnown::Wrapper) => 1,
            _ => 2,
        },
        _ => 0,
    }
}

/// How many pools keep their layouts: a VM holds one pool per filter
/// configuration. A pool's owner forgets its layouts when it lets the pool
/// go ([`forget_layouts`]); past this many, the pool used longest ago goes.
const KEPT_POOLS: usize = 4;

/// The layouts of one pool's types, by naming option (lowerCamelCase keys,
/// `.proto` names). Types come from one descriptor pool, where each full
/// name is a string of its own, so the name's address tells types apart
/// without hashing the name; holding the pool keeps those addresses.
/// Bounded by the pool's message types, twice.
struct PoolLayouts {
    pool: DescriptorPool,
    by_name: [HashMap<usize, Rc<Layout>>; 2],
}

thread_local! {
    /// Most recently used first. Per thread: a layout holds `Rc`s, and a
    /// wasm VM has one thread.
    static KEPT: RefCell<Vec<PoolLayouts>> = const { RefCell::new(Vec::new()) };
}

/// Drops what is kept for `pool`, and with it the cache's reference to the
/// pool: its owner calls this when replacing or changing the pool, so that
/// a schema no longer served is not held (wasm memory never shrinks), and
/// a pool about to change is not copied because the cache shares it.
pub fn forget_layouts(pool: &DescriptorPool) {
    // A thread that is exiting has nothing to forget.
    let _ = KEPT.try_with(|kept| {
        if let Ok(mut kept) = kept.try_borrow_mut() {
            kept.retain(|p| p.pool != *pool);
        }
    });
}

/// How many pools have layouts kept on this thread.
/// The wire type a field of `kind` is written with; `None` for a message
/// (length-delimited, or a group).
pub(super) fn wire_type_of(kind: &Kind) -> Option<WireType> {
    Some(match kind {
        Kind::Int32
        | Kind::Int64
        | Kind::Uint32
        | Kind::Uint64
        | Kind::Sint32
        | Kind::Sint64
        | Kind::Bool
        | Kind::Enum(_) => WireType::Varint,
        Kind::Fixed32 | Kind::Sfixed32 | Kind::Float => WireType::ThirtyTwoBit,
        Kind::Fixed64 | Kind::Sfixed64 | Kind::Double => WireType::SixtyFourBit,
        Kind::String | Kind::Bytes => WireType::LengthDelimited,
        Kind::Message(_) => return None,
    })
}

#[cfg(test)]
pub(crate) fn kept_pool_count() -> usize {
    KEPT.with(|kept| kept.borrow().len())
}

fn kept_layout(desc: &MessageDescriptor, proto_names: bool) -> Rc<Layout> {
    KEPT.with(|kept| {
        let mut kept = kept.borrow_mut();
        let pool = desc.parent_pool();
        match kept.iter().position(|p| p.pool == *pool) {
            Some(0) => {}
            Some(at) => kept[..=at].rotate_right(1),
            None => {
                kept.truncate(KEPT_POOLS - 1);
                kept.insert(
                    0,
                    PoolLayouts {
                        pool: pool.clone(),
                        by_name: Default::default(),
                    },
                );
            }
        }
        kept[0].by_name[usize::from(proto_names)]
            .entry(desc.full_name().as_ptr() as usize)
            .or_insert_with(|| Rc::new(Layout::new(desc, proto_names)))
            .clone()
    })
}

/// One printing's view of the kept layouts.
pub(crate) struct Layouts {
    proto_names: bool,
    /// The type asked for last: a list asks for one type many times.
    last: Option<(usize, Rc<Layout>)>,
}

impl Layouts {
    pub(crate) fn new(proto_names: bool) -> Layouts {
        Layouts {
            proto_names,
            last: None,
        }
    }

    pub(crate) fn of(&mut self, desc: &MessageDescriptor) -> Rc<Layout> {
        // Within one printing every type comes from one pool.
        let key = desc.full_name().as_ptr() as usize;
        if let Some((last, layout)) = &self.last {
            if *last == key {
                return layout.clone();
            }
        }
        let layout = kept_layout(desc, self.proto_names);
        self.last = Some((key, layout.clone()));
        layout
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::{protobuf_to_json, JsonOptions};
    use crate::Registry;

    #[test]
    fn each_pool_prints_by_its_own_layouts_and_four_pools_are_kept() {
        // A list takes the message to the wire printer. Each pool names the
        // field differently; pools are dropped as they go, so a later pool
        // may reuse an earlier one's addresses, the layouts' keys.
        for round in 0..2 {
            for i in 0..6 {
                let mut registry = Registry::new().unwrap();
                let proto = format!(
                    "syntax = \"proto3\"; package p; message M {{ repeated int32 f{i} = 1; }}"
                );
                registry.add_sources([("p.proto", proto.as_str())]).unwrap();
                let desc = registry.message("p.M").unwrap();
                let json = protobuf_to_json(&desc, &[0x0a, 0x01, 0x05], &JsonOptions::default());
                assert_eq!(json.unwrap(), format!(r#"{{"f{i}":[5]}}"#), "round {round}");
            }
        }
        KEPT.with(|kept| assert_eq!(kept.borrow().len(), KEPT_POOLS));
    }

    #[test]
    fn a_pool_changed_or_forgotten_takes_its_layouts_with_it() {
        let kept = kept_pool_count;
        let mut registry = Registry::new().unwrap();
        let proto = "syntax = \"proto3\"; package q; message M { repeated int32 f = 1; }";
        registry.add_sources([("q.proto", proto)]).unwrap();
        let print = |registry: &Registry| {
            let desc = registry.message("q.M").unwrap();
            protobuf_to_json(&desc, &[0x0a, 0x01, 0x05], &JsonOptions::default()).unwrap()
        };
        let before = kept();
        assert_eq!(print(&registry), r#"{"f":[5]}"#);
        assert_eq!(kept(), before + 1);
        // A pool about to change is forgotten first (and not copied).
        registry
            .add_sources([("r.proto", "syntax = \"proto3\"; package r;")])
            .unwrap();
        assert_eq!(kept(), before);
        assert_eq!(print(&registry), r#"{"f":[5]}"#);
        assert_eq!(kept(), before + 1);
        forget_layouts(registry.pool());
        assert_eq!(kept(), before);
    }
}
