//! What a client has loaded into the module (`.proto` sources, descriptor
//! sets, JSON print options) and the module configuration made of it. A
//! change builds the next set beside the current one; the client keeps it
//! only once the module took it, so a refused file leaves nothing behind.

use std::collections::{BTreeMap, BTreeSet};

use base64::Engine;
use serde_json::{Map, Value};

use crate::limits::MAX_LOADED_SET_BYTES;

/// Stands in for "no schema yet": the module wants some configuration.
const EMPTY_PROTO: (&str, &str) = ("empty.proto", "syntax = \"proto3\";");

#[derive(Debug, Clone, Default)]
pub(super) struct ProtoSet {
    sources: BTreeMap<String, String>,
    /// One set of the descriptor sets' files, each name once.
    descriptor_sets: Vec<u8>,
    set_files: BTreeSet<String>,
    print_options: Map<String, Value>,
}

impl ProtoSet {
    pub(super) fn has_file(&self, name: &str) -> bool {
        self.sources.contains_key(name)
    }

    /// This set and `files` (name, source).
    pub(super) fn with_files(&self, files: BTreeMap<String, String>) -> ProtoSet {
        let mut next = self.clone();
        next.sources.extend(files);
        next
    }

    /// This set and the files of one more serialized
    /// `FileDescriptorSet` that it does not hold by name: the module keeps
    /// the first file loaded under a name, so a set loaded again (a
    /// repeated reflection) adds nothing and the set stays bounded.
    /// All the sets together stay within [`MAX_LOADED_SET_BYTES`].
    pub(super) fn with_descriptor_set(&self, bytes: &[u8]) -> Result<ProtoSet, String> {
        let mut next = self.clone();
        for (name, file) in grpc_wasm::descriptors::set_files(bytes)? {
            if !next.sources.contains_key(&name) && next.set_files.insert(name) {
                grpc_wasm::descriptors::push_file(&mut next.descriptor_sets, file);
            }
        }
        if next.descriptor_sets.len() > MAX_LOADED_SET_BYTES {
            return Err(format!(
                "the descriptor sets loaded in this worker would hold {} bytes, over the limit of \
                 {MAX_LOADED_SET_BYTES}",
                next.descriptor_sets.len()
            ));
        }
        Ok(next)
    }

    /// The JSON options calls print with (what `set_print_options` gave).
    pub(super) fn json_options(&self) -> grpc_wasm::JsonOptions {
        serde_json::from_value::<grpc_wasm::json::PrintOptions>(Value::Object(
            self.print_options.clone(),
        ))
        .unwrap_or_default()
        .json_options(false)
    }

    pub(super) fn with_print_options(&self, options: Map<String, Value>) -> ProtoSet {
        ProtoSet {
            print_options: options,
            ..self.clone()
        }
    }

    /// The module's configuration (callout mode, calls routed by
    /// `upstream_header`).
    pub(super) fn config(&self, upstream_header: &str) -> String {
        let mut config = serde_json::json!({
            "protos": self.sources,
            "callout": {"upstream_header": upstream_header},
            "print_options": self.print_options,
        });
        if !self.descriptor_sets.is_empty() {
            config["descriptor_set"] = base64::engine::general_purpose::STANDARD
                .encode(&self.descriptor_sets)
                .into();
        }
        if self.sources.is_empty() && self.descriptor_sets.is_empty() {
            let (name, source) = EMPTY_PROTO;
            config["protos"] = serde_json::json!({ name: source });
        }
        config.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_leaves_the_current_set_as_it_was() {
        let current = ProtoSet::default();
        let files = BTreeMap::from([("a.proto".to_string(), "syntax = \"proto3\";".to_string())]);
        let next = current
            .with_files(files)
            .with_descriptor_set(b"\x0a\x03\x0a\x01b")
            .unwrap();
        let again = next.with_descriptor_set(b"\x0a\x03\x0a\x01b").unwrap();
        assert!(next.has_file("a.proto"));
        assert!(!current.has_file("a.proto"));
        let config: Value = serde_json::from_str(&next.config("x-up")).unwrap();
        assert_eq!(config["protos"]["a.proto"], "syntax = \"proto3\";");
        assert_eq!(config["descriptor_set"], "CgMKAWI=");
        // A file of a name the set holds is not added again.
        assert_eq!(again.config("x-up"), next.config("x-up"));
        assert_eq!(config["callout"]["upstream_header"], "x-up");
    }

    #[test]
    fn an_empty_set_configures_an_empty_schema() {
        let config: Value = serde_json::from_str(&ProtoSet::default().config("x-up")).unwrap();
        assert_eq!(config["protos"]["empty.proto"], "syntax = \"proto3\";");
        assert!(config.get("descriptor_set").is_none());
    }
}
