//! Protobuf → JSON. Three printers, tried in turn: `flat` for messages of
//! scalars alone (most replies), `wire` reading any message's wire bytes
//! as they come, and `print` over a decoded `DynamicMessage` for what the
//! wire reader hands over (groups, extensions). Each is bounded by `cost`,
//! which says how much JSON a message's wire bytes may become.
//!
//! Imports go one way: `wire` → `flat` → `print` → `layout` → `quote`.

pub mod cost;
mod flat;
mod layout;
mod print;
mod quote;
mod wire;

pub use layout::forget_layouts;
#[cfg(test)]
pub(crate) use layout::kept_pool_count;

use prost_reflect::{DynamicMessage, MessageDescriptor, ReflectMessage};

use super::{decode_message, JsonOptions};
use crate::error::Error;
use crate::limits::MAX_JSON_PER_BYTE;

pub(super) use flat::is_flat;

/// Writes a decoded message as JSON text.
pub(super) fn message_to_json(
    message: &DynamicMessage,
    options: &JsonOptions,
) -> Result<String, Error> {
    let mut printer = print::Printer::new(options, 128);
    printer.message(message).map_err(|reason| Error::Encode {
        message_type: message.descriptor().full_name().to_string(),
        reason,
    })?;
    Ok(printer.out)
}

/// Writes protobuf bytes of type `desc` as JSON text; `flat` says whether
/// the type takes the flat printer ([`is_flat`]).
pub(super) fn print_json(
    desc: &MessageDescriptor,
    flat: bool,
    bytes: &[u8],
    options: &JsonOptions,
) -> Result<String, Error> {
    if flat {
        // Most replies: small, so their JSON starts at about its size.
        let capacity = 16 + 2 * bytes.len().min(4096);
        let printed = print_within_cost(desc, bytes.len(), options, capacity, |p| {
            flat::print(p, desc, bytes)
                .map_or(Err(wire::Stop::general()), |r| r.map_err(wire::Stop::print))
        });
        if let Some(printed) = printed {
            return printed;
        }
    }
    if let Some(printed) = print_within_cost(desc, bytes.len(), options, 128, |p| {
        wire::print(p, desc, bytes)
    }) {
        return printed;
    }
    // Groups and extensions: decoded whole, as prost-reflect reads them.
    let message = decode_message(desc, bytes)?;
    print_within_cost(desc, bytes.len(), options, 128, |p| {
        p.message(&message).map_err(wire::Stop::print)
    })
    .unwrap_or_else(|| Err(encode_error(desc, "no path prints it".into())))
}

/// Runs `print` on a printer bounded as `json::cost` says; `None` when it
/// hands the message to the general path. A message whose JSON passed
/// what the printer keeps while it grows, but not its limit, is printed
/// once more into a string of its exact size: growing a string copies it,
/// so holding one near the limit would cost half as much again.
fn print_within_cost(
    desc: &MessageDescriptor,
    wire_len: usize,
    options: &JsonOptions,
    capacity: usize,
    mut print: impl FnMut(&mut print::Printer) -> Result<(), wire::Stop>,
) -> Option<Result<String, Error>> {
    let limit = cost::max_json_bytes(wire_len);
    let mut printer = print::Printer::new(options, capacity.min(limit))
        .with_limit(limit)
        .keeping(cost::kept_json_bytes(wire_len));
    // Checked once more at the end, so that every path refuses exactly the
    // messages whose JSON passes the limit, wherever a printer happened to
    // check; and before a second pass, which must not reserve more.
    let mut printed =
        print(&mut printer).and_then(|()| printer.check_limit_now().map_err(wire::Stop::print));
    if let (Ok(()), Some(len)) = (&printed, printer.dropped_json_len()) {
        // The first pass's JSON goes before the second's is reserved.
        drop(std::mem::take(&mut printer.out));
        let mut out = String::new();
        if out
            .try_reserve_exact(len.saturating_add(crate::limits::JSON_SLACK_BYTES))
            .is_err()
        {
            return Some(Err(too_costly(desc, wire_len, limit)));
        }
        printer = print::Printer::new(options, 0).with_limit(limit);
        printer.out = out;
        printed =
            print(&mut printer).and_then(|()| printer.check_limit_now().map_err(wire::Stop::print));
    }
    Some(match printed.map_err(wire::Stop::why) {
        Ok(()) => Ok(printer.out),
        Err(wire::Why::General) => return None,
        Err(wire::Why::Decode(reason)) => Err(Error::Decode {
            message_type: desc.full_name().to_string(),
            reason,
        }),
        Err(wire::Why::Print(_)) if printer.over_limit => Err(too_costly(desc, wire_len, limit)),
        Err(wire::Why::Print(reason)) => Err(encode_error(desc, reason)),
    })
}

fn too_costly(desc: &MessageDescriptor, wire_len: usize, limit: usize) -> Error {
    Error::TooCostly {
        message_type: desc.full_name().to_string(),
        reason: format!(
            "its JSON passes {limit} bytes, {MAX_JSON_PER_BYTE} per byte of its {wire_len} (and 64 KiB more)",
        ),
    }
}

fn encode_error(desc: &MessageDescriptor, reason: String) -> Error {
    Error::Encode {
        message_type: desc.full_name().to_string(),
        reason,
    }
}
