//! What the module is configured with: `.proto` files with the files they
//! import (walked here, among the caller's directories), descriptor sets
//! and print options, kept in a [`ProtoSet`] once the module took them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::protos::ProtoSet;
use super::{Client, ClientError, UPSTREAM_HEADER};
use std::sync::Arc;

use grpc_wasm::Registry;

use crate::call::CallId;
use crate::host::{HostError, ProxyHost};
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
        self.change_protos(|protos| Ok(protos.with_files(found)))
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
        self.change_protos(|protos| protos.with_descriptor_set(bytes).map_err(refused))
    }

    /// What is loaded, as JSON (the core's `describe`): the services for
    /// an empty `name`, else the service, method, message or enum called
    /// `name`.
    pub fn describe(&self, name: &str) -> Result<Vec<u8>, ClientError> {
        let loaded = self.loaded()?;
        let pool = loaded.pool();
        let value = if name.is_empty() {
            grpc_wasm::describe::services(pool)
        } else {
            grpc_wasm::describe::describe(pool, name)
                .ok_or_else(|| ClientError::NotLoaded(name.to_string()))?
        };
        Ok(value.to_string().into_bytes())
    }

    /// An OpenAPI 3.1 document of what is loaded, as a transcoder would
    /// serve it with the worker's JSON options (the core's `openapi`).
    pub fn openapi(
        &self,
        title: &str,
        stream_format: grpc_wasm::http_rule::StreamFormat,
        services: Option<&[String]>,
    ) -> Result<Vec<u8>, ClientError> {
        let loaded = self.loaded()?;
        let json = lock(&self.inner.protos).json_options();
        let options = grpc_wasm::openapi::Options {
            json: &json,
            stream_format,
            title,
        };
        grpc_wasm::openapi::document_of(&loaded, services, &options).map_err(refused)
    }

    /// What the module is configured with, as a registry here, made once
    /// per change: the module's own files, read back.
    fn loaded(&self) -> Result<Arc<Registry>, ClientError> {
        let _changing = lock(&self.inner.changing);
        if let Some(loaded) = lock(&self.inner.loaded).clone() {
            return Ok(loaded);
        }
        let (set, woken) = {
            let mut host = lock(&self.inner.host);
            let set = host.descriptor_set();
            self.checked(&mut host, set)
        };
        self.wake(woken);
        let loaded = Arc::new(registry_of(&set?)?);
        *lock(&self.inner.loaded) = Some(loaded.clone());
        Ok(loaded)
    }

    /// Sets the module's JSON print options (`emit_defaults`, ...).
    pub fn set_print_options(
        &self,
        options: serde_json::Map<String, serde_json::Value>,
    ) -> Result<(), ClientError> {
        let _changing = lock(&self.inner.changing);
        self.change_protos(|protos| Ok(protos.with_print_options(options)))
    }

    /// Configures the module with the set `change` makes of the current
    /// one, and keeps it only if the module took it. A refusal leaves the
    /// module as it was; a trap rebuilds it (`recover`) with the current
    /// set, which never held the change. The caller holds `changing`.
    pub(super) fn change_protos(
        &self,
        change: impl FnOnce(&ProtoSet) -> Result<ProtoSet, ClientError>,
    ) -> Result<(), ClientError> {
        self.change_protos_checked(change, |_| Ok(()))
    }

    /// [`Client::change_protos`], kept only if `check` also passes on the
    /// module configured with it; else the module goes back to the
    /// current set.
    pub(super) fn change_protos_checked(
        &self,
        change: impl FnOnce(&ProtoSet) -> Result<ProtoSet, ClientError>,
        check: impl FnOnce(&mut ProxyHost) -> Result<(), ClientError>,
    ) -> Result<(), ClientError> {
        let next = change(&lock(&self.inner.protos))?;
        let config = next.config(UPSTREAM_HEADER);
        let (result, woken) = {
            let mut host = lock(&self.inner.host);
            let result = host.configure(config.as_bytes());
            let (result, woken) = self.checked(&mut host, result);
            let (result, woken) = match result.map_err(ClientError::from) {
                Ok(()) => self.check_change(&mut host, check, woken),
                Err(e) => (Err(e), woken),
            };
            if result.is_ok() {
                *lock(&self.inner.loaded) = None;
                // Kept while the module is still locked: a trap on another
                // thread (a tick, a transport event) rebuilds the instance
                // with the set it was configured with, never the one before.
                *lock(&self.inner.protos) = next;
            }
            (result, woken)
        };
        self.wake(woken);
        result
    }

    /// `check` on the module configured with a change; when it fails, the
    /// module goes back to the current set (a trap in it rebuilds the
    /// instance with that set, as any trap does).
    fn check_change(
        &self,
        host: &mut ProxyHost,
        check: impl FnOnce(&mut ProxyHost) -> Result<(), ClientError>,
        woken: Vec<CallId>,
    ) -> (Result<(), ClientError>, Vec<CallId>) {
        match check(host) {
            Ok(()) => (Ok(()), woken),
            Err(ClientError::Host(e @ HostError::Trap(_))) => {
                let more = self.recover(host, &e);
                (Err(ClientError::Host(e)), super::merge(woken, more))
            }
            Err(e) => {
                let current = self.config();
                let back = host.configure(current.as_bytes());
                let (back, more) = self.checked(host, back);
                if let Err(back) = back {
                    eprintln!("[grpc-wasm] the module refused its current set again: {back}");
                }
                (Err(e), super::merge(woken, more))
            }
        }
    }

    /// The module's configuration for what is loaded now.
    pub(super) fn config(&self) -> String {
        lock(&self.inner.protos).config(UPSTREAM_HEADER)
    }
}

/// A set refused before the module sees it, named as the module names
/// what it refuses.
pub(super) fn refused(why: String) -> ClientError {
    ClientError::Host(crate::host::HostError::Core(why))
}

/// A registry of the files of an encoded set the module gave.
pub(super) fn registry_of(set: &[u8]) -> Result<Registry, ClientError> {
    let mut registry = Registry::new().map_err(|e| refused(e.to_string()))?;
    registry
        .add_descriptor_set(set)
        .map_err(|e| refused(e.to_string()))?;
    Ok(registry)
}
