//! Smoke test of the real .wasm under wasmtime: load protos, transcode both
//! ways, and get the core's errors back as errors, not traps.
//!
//! The module comes from `make wasm` (target/grpc_wasm.wasm) or from the
//! path in GRPC_WASM_MODULE.

use grpc_wasm::JsonOptions;
use lua_shim::{CoreModule, HostError};

fn module() -> CoreModule {
    let path = std::env::var("GRPC_WASM_MODULE").unwrap_or_else(|_| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/../target/grpc_wasm.wasm").to_string()
    });
    let bytes = std::fs::read(&path)
        .unwrap_or_else(|e| panic!("cannot read {path} ({e}); run `make wasm` first"));
    let mut core = CoreModule::new(&bytes).expect("module instantiates");
    core.load_proto(
        "route_guide.proto",
        include_str!("../../protos/route_guide.proto"),
    )
    .expect("route_guide.proto compiles inside wasm");
    core
}

#[test]
fn transcodes_json_to_protobuf_and_back() {
    let mut core = module();
    let json = br#"{"name":"A","location":{"latitude":409146138,"longitude":-746188906}}"#;
    let bytes = core.json_to_proto("routeguide.Feature", json).unwrap();
    assert_eq!(
        bytes,
        [
            10, 1, 65, 18, 17, 8, 154, 166, 140, 195, 1, 16, 150, 159, 152, 156, 253, 255, 255,
            255, 255, 1
        ]
    );
    let back = core.proto_to_json("routeguide.Feature", &bytes).unwrap();
    assert_eq!(back, json.to_vec());
}

#[test]
fn json_options_apply_inside_wasm() {
    let mut core = module();
    core.set_json_options(&JsonOptions {
        emit_defaults: true,
        proto_field_names: true,
        ..JsonOptions::default()
    })
    .unwrap();
    let out = core
        .proto_to_json("routeguide.RouteSummary", &[0x08, 0x02])
        .unwrap();
    assert_eq!(
        String::from_utf8(out).unwrap(),
        r#"{"point_count":2,"feature_count":0,"distance":0,"elapsed_time":0}"#
    );
}

#[test]
fn proto_to_proto_decodes_and_encodes_again() {
    let mut core = module();
    // point_count 2 written as a 10-byte varint comes back in its short form.
    let long = [
        0x08, 0x82, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00,
    ];
    assert_eq!(
        core.proto_to_proto("routeguide.RouteSummary", &long)
            .unwrap(),
        [0x08, 0x02]
    );
    let err = core
        .proto_to_proto("routeguide.RouteSummary", &[0x08])
        .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("invalid routeguide.RouteSummary message: "),
        "{err}"
    );
}

#[test]
fn core_errors_come_back_as_messages() {
    let mut core = module();
    let err = core
        .json_to_proto(
            "routeguide.Feature",
            br#"{"location":{"latitude":"north"}}"#,
        )
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "location.latitude: expected an integer, got a string that is not one"
    );
    assert!(matches!(
        core.json_to_proto("routeguide.Nope", b"{}"),
        Err(HostError::Core(m)) if m == "unknown message type 'routeguide.Nope'"
    ));
    let err = core
        .load_proto("bad.proto", "syntax = \"proto3\";\nmessage {")
        .unwrap_err();
    assert!(err.to_string().starts_with("bad.proto:2:9: "), "{err}");
    // Garbage never traps: the module is still usable afterwards.
    for junk in [&b"\xff\xff\xff"[..], b"", b"\x0a\x05"] {
        let _ = core.proto_to_json("routeguide.Feature", junk);
    }
    let _ = core.json_to_proto("routeguide.Feature", &[0xc3, 0x28]);
    assert!(core
        .json_to_proto("routeguide.Point", br#"{"latitude":1}"#)
        .is_ok());
}
