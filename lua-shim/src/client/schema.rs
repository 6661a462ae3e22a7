//! What the module is configured with: `.proto` files with the files they
//! import (walked here, among the caller's directories), descriptor sets
//! and print options, kept in a [`ProtoSet`] once the module took them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::protos::ProtoSet;
use super::{Client, ClientError, UPSTREAM_HEADER};
use crate::sync::lock;

impl Client {
    /// Loads a `.proto` file and, recursively, the files it imports, found
    /// in the file's own directory and then `include`. google/api,
    /// google/rpc and the well-known types are bundled in the module.
    pub fn load_file(&self, path: &Path, include: &[PathBuf]) -> Result<(), ClientError> {
        let mut dirs: Vec<PathBuf> = include.to_vec();
        if let Some(parent) = path.parent() {
            dirs.insert(
                0,
                if parent.as_os_str().is_empty() {
                    PathBuf::from(".")
                } else {
                    parent.to_path_buf()
                },
            );
        }
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let _changing = lock(&self.inner.changing);
        let mut found = BTreeMap::new();
        self.collect(&name, path, &dirs, &mut found)?;
        // A file that parses but does not compile must not stay loaded: it
        // would fail every later load, and shadow a fixed file of the same
        // name.
        self.change_protos(|protos| protos.with_files(found))
    }

    fn collect(
        &self,
        name: &str,
        path: &Path,
        dirs: &[PathBuf],
        found: &mut BTreeMap<String, String>,
    ) -> Result<(), ClientError> {
        if found.contains_key(name) || lock(&self.inner.protos).has_file(name) {
            return Ok(());
        }
        let source = std::fs::read_to_string(path)
            .map_err(|e| ClientError::Io(path.display().to_string(), e.to_string()))?;
        let (imports, woken) = {
            let mut host = lock(&self.inner.host);
            let imports = host.proto_imports(name, &source);
            self.checked(&mut host, imports)
        };
        self.wake(woken);
        let imports = imports?;
        found.insert(name.to_string(), source);
        for import in imports {
            match dirs.iter().map(|d| d.join(&import)).find(|p| p.is_file()) {
                Some(p) => self.collect(&import, &p, dirs, found)?,
                None if import.starts_with("google/") => {}
                None => {
                    return Err(ClientError::MissingImport(
                        import,
                        name.to_string(),
                        dirs.to_vec(),
                    ))
                }
            }
        }
        Ok(())
    }

    /// Adds a serialized `FileDescriptorSet` (sets concatenate into one).
    pub fn load_descriptor_set(&self, bytes: &[u8]) -> Result<(), ClientError> {
        let _changing = lock(&self.inner.changing);
        self.change_protos(|protos| protos.with_descriptor_set(bytes))
    }

    /// Sets the module's JSON print options (`emit_defaults`, ...).
    pub fn set_print_options(
        &self,
        options: serde_json::Map<String, serde_json::Value>,
    ) -> Result<(), ClientError> {
        let _changing = lock(&self.inner.changing);
        self.change_protos(|protos| protos.with_print_options(options))
    }

    /// Configures the module with the set `change` makes of the current
    /// one, and keeps it only if the module took it. A refusal leaves the
    /// module as it was; a trap rebuilds it (`recover`) with the current
    /// set, which never held the change. The caller holds `changing`.
    pub(super) fn change_protos(
        &self,
        change: impl FnOnce(&ProtoSet) -> ProtoSet,
    ) -> Result<(), ClientError> {
        let next = change(&lock(&self.inner.protos));
        let config = next.config(UPSTREAM_HEADER);
        let (result, woken) = {
            let mut host = lock(&self.inner.host);
            let result = host.configure(config.as_bytes());
            let (result, woken) = self.checked(&mut host, result);
            if result.is_ok() {
                // Kept while the module is still locked: a trap on another
                // thread (a tick, a transport event) rebuilds the instance
                // with the set it was configured with, never the one before.
                *lock(&self.inner.protos) = next;
            }
            (result, woken)
        };
        self.wake(woken);
        Ok(result?)
    }

    /// The module's configuration for what is loaded now.
    pub(super) fn config(&self) -> String {
        lock(&self.inner.protos).config(UPSTREAM_HEADER)
    }
}
