//! Generates the KServe v2 gRPC client and server from `proto/`, and the descriptor set of
//! Triton's model config and statistics (and of the service, for the conformance test), with the `protoc` that ships inside the
//! `protoc-bin-vendored` crate (or `$PROTOC` when set), so nothing needs installing on the
//! build machine.

use std::path::PathBuf;
use std::process::Command;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var_os("PROTOC").is_none() {
        std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?);
    }
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=proto/grpc_service.proto");
    println!("cargo:rerun-if-changed=proto/model_config.proto");
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Tensor contents as `Bytes`: raw contents pass between HTTP and gRPC without copies.
        .bytes(".")
        // A message that does not decode is the sender's mistake: INVALID_ARGUMENT.
        .codec_path("crate::protocol::grpc::codec::Codec")
        // The simulator serves only what a model server's tests need; the rest of
        // Triton's service answers UNIMPLEMENTED there (the gateway's door has them all).
        .generate_default_stubs(true)
        .compile_protos(&["proto/grpc_service.proto"], &["proto"])?;
    // No code for the model config: `protocol::grpc::config` reads it by reflection.
    let out = PathBuf::from(std::env::var_os("OUT_DIR").ok_or("OUT_DIR is not set")?);
    let status = Command::new(std::env::var_os("PROTOC").ok_or("PROTOC is not set")?)
        .arg("--proto_path=proto")
        .arg(format!(
            "--descriptor_set_out={}",
            out.join("model_config.bin").display()
        ))
        .arg("proto/model_config.proto")
        .arg("proto/grpc_service.proto")
        .status()?;
    if !status.success() {
        return Err(format!("protoc failed on proto/model_config.proto and grpc_service.proto: {status}").into());
    }
    Ok(())
}
