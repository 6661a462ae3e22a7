//! What printing a message may cost, bounded before it is paid.
//!
//! A message's JSON can be many times its wire size (a packed list of
//! enums with long names printed a 4 MiB message as 260 MB of JSON, issue
//! 26), and the hosts' wasm memory never shrinks: the printer stops at
//! [`max_json_bytes`] and the message is refused RESOURCE_EXHAUSTED.
//!
//! What printing holds besides its JSON is bounded by the printer itself:
//! it reads the wire bytes in place (`json::wire`), with an index of 4
//! bytes per field occurrence, instead of decoding a tree of `Value`s that
//! cost tens of times the wire size.

use crate::limits::{JSON_SLACK_BYTES, KEPT_JSON_PER_BYTE, MAX_JSON_PER_BYTE};

/// The JSON a message of `wire` bytes may print to: [`MAX_JSON_PER_BYTE`]
/// per wire byte and 64 KiB more, which base64, enum names of ordinary
/// length and timestamps stay within.
pub fn max_json_bytes(wire: usize) -> usize {
    wire.saturating_mul(MAX_JSON_PER_BYTE)
        .saturating_add(JSON_SLACK_BYTES)
}

/// The JSON a printer keeps while it grows, for a message of `wire`
/// bytes: [`KEPT_JSON_PER_BYTE`] per wire byte and 64 KiB more. Past it
/// the printer only counts, and prints a message that fits
/// [`max_json_bytes`] once more at its exact size.
pub fn kept_json_bytes(wire: usize) -> usize {
    wire.saturating_mul(KEPT_JSON_PER_BYTE)
        .saturating_add(JSON_SLACK_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::{protobuf_to_json, JsonOptions};
    use crate::{Code, Error, Registry};

    const PROTO: &str = r#"syntax = "proto3";
package cost;
import "google/protobuf/timestamp.proto";
enum Long {
  LONG_ZERO_AND_A_NAME_THAT_GOES_ON_AND_ON_FOR_SIXTY_FOUR_CHARACTERS_ = 0;
  LONG_ONE_AND_A_NAME_THAT_GOES_ON_AND_ON_FOR_SIXTY_FOUR_CHARACTERS__ = 1;
}
message Enums { repeated Long values = 1; }
message Times { repeated google.protobuf.Timestamp at = 1; }
message Flags { repeated bool on = 1; }
message Text { string s = 1; bytes b = 2; }
"#;

    fn registry() -> Registry {
        let mut r = Registry::new().unwrap();
        r.add_sources([("cost.proto", PROTO)]).unwrap();
        r
    }

    fn print(type_name: &str, bytes: &[u8]) -> Result<String, Error> {
        let desc = registry().message(type_name).unwrap();
        protobuf_to_json(&desc, bytes, &JsonOptions::default())
    }

    #[test]
    fn json_past_what_the_printer_keeps_is_counted_then_printed_at_its_size() {
        // Past 3 bytes per wire byte (and 64 KiB) the printer only counts;
        // JSON within 8 is printed a second time, and must be the same.
        let flags = packed(1, &[0, 1].repeat(100_000));
        let mut control = vec![0x0a];
        prost::encoding::encode_varint(100_000, &mut control);
        control.extend([0x01; 100_000]);
        for (type_name, bytes, len) in [
            ("cost.Flags", &flags, 1_100_008),
            ("cost.Text", &control, 600_008),
        ] {
            let desc = registry().message(type_name).unwrap();
            let json = print(type_name, bytes).unwrap();
            assert!(len > kept_json_bytes(bytes.len()), "{type_name}");
            assert_eq!(json.len(), len, "{type_name}");
            let message = crate::json::decode_message(&desc, bytes).unwrap();
            let tree = crate::json::message_to_json(&message, &JsonOptions::default()).unwrap();
            assert_eq!(json, tree, "{type_name}");
        }
    }

    #[test]
    fn a_flat_message_keeps_the_last_of_a_field_given_again() {
        // The flat path held 32 bytes per occurrence.
        let mut bytes = [0x12, 0x01, b'a'].repeat(50_000);
        bytes.extend([0x12, 0x01, b'z']);
        assert_eq!(print("cost.Text", &bytes).unwrap(), r#"{"b":"eg=="}"#);
        // A string replaced later is still checked, as the general path
        // decodes it (the flat path printed {"s":"a"}).
        let err = print("cost.Text", &[0x0a, 0x01, 0xff, 0x0a, 0x01, b'a']).unwrap_err();
        assert_eq!(err.response_code(), Code::Internal, "{err}");
    }

    #[test]
    fn a_large_string_kept_leaves_room_after_it() {
        // An unknown field sends the message to the wire path; the string
        // of control characters prints 6 bytes per byte, within what the
        // printer keeps. Reserved exactly, the closing brace doubled it.
        let mut bytes = vec![0xfa, 0x06];
        prost::encoding::encode_varint(500_000, &mut bytes);
        bytes.extend(vec![b'x'; 500_000]);
        bytes.push(0x0a);
        prost::encoding::encode_varint(500_000, &mut bytes);
        bytes.extend(vec![0x01; 500_000]);
        let json = print("cost.Text", &bytes).unwrap();
        assert_eq!(json.len(), 3_000_008);
        assert!(json.capacity() < 3_300_000, "{}", json.capacity());
    }

    #[test]
    fn a_small_reply_holds_a_small_string() {
        // A list sends the message to the wire printer, which reserved its
        // 64 KiB of slack on the first value: 128 KiB for this reply, and a
        // realloc that cost more than the rest of the printing.
        let json = print("cost.Flags", &packed(1, &[1, 0, 1])).unwrap();
        assert_eq!(json, r#"{"on":[true,false,true]}"#);
        assert!(json.capacity() <= 256, "{}", json.capacity());
    }

    fn packed(field: u8, values: &[u8]) -> Vec<u8> {
        let mut bytes = vec![(field << 3) | 2];
        prost::encoding::encode_varint(values.len() as u64, &mut bytes);
        bytes.extend_from_slice(values);
        bytes
    }

    #[test]
    fn json_past_eight_bytes_per_wire_byte_is_refused_while_printing() {
        // Each four-byte element prints as a 66-character name: 17 bytes
        // of JSON per wire byte.
        let values: Vec<u8> = [0x81, 0x80, 0x80, 0x00].repeat(40_000);
        let err = print("cost.Enums", &packed(1, &values)).unwrap_err();
        assert_eq!(err.response_code(), Code::ResourceExhausted);
        assert_eq!(
            err.to_string(),
            "cannot transcode cost.Enums: its JSON passes 1345568 bytes, 8 per byte of its 160004 (and 64 KiB more)"
        );
        // Timestamps of today print within it: 8 wire bytes, 22 of JSON.
        let times = [0x0a, 0x06, 0x08, 0x80, 0xa4, 0xc8, 0xaa, 0x06].repeat(10_000);
        let json = print("cost.Times", &times).unwrap();
        assert!(json.len() <= max_json_bytes(times.len()), "{}", json.len());
    }

    /// Timestamps whose JSON passes what the printer keeps (5.75 bytes per
    /// wire byte): the first pass only counts them, the second prints them.
    #[test]
    fn timestamps_only_counted_at_first_print_as_the_tree_prints_them() {
        let desc = registry().message("cost.Times").unwrap();
        let options = JsonOptions::default();
        let tree = |bytes: &[u8]| {
            let message = crate::json::decode_message(&desc, bytes).unwrap();
            crate::json::message_to_json(&message, &options).map_err(|e| e.to_string())
        };
        // One second, one with nanos (a fraction), one negative: each
        // element's length differs, past the threshold and before it.
        let mut times = Vec::new();
        for i in 0..40_000u32 {
            let element: &[u8] = match i % 8 {
                0..=5 => &[0x0a, 0x02, 0x08, 0x01],
                6 => &[0x0a, 0x05, 0x08, 0x02, 0x10, 0xe8, 0x07],
                _ => &[
                    0x0a, 0x0b, 0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
                ],
            };
            times.extend_from_slice(element);
        }
        let json = print("cost.Times", &times).unwrap();
        assert!(
            json.len() > 3 * times.len() + (64 << 10),
            "kept whole: {}",
            json.len()
        );
        // Compared whole, reported short: the JSON is a megabyte.
        assert!(json == tree(&times).unwrap(), "the two printers differ");
        // Out of range past the threshold: the same refusal as the tree's.
        let mut bad = times.clone();
        // 2^40 seconds: year 36812.
        bad.extend_from_slice(&[0x0a, 0x07, 0x08, 0x80, 0x80, 0x80, 0x80, 0x80, 0x20]);
        let err = print("cost.Times", &bad)
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert_eq!(Err(err), tree(&bad).map(|_| ()));
    }
}
