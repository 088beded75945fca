//! Generates the KServe v2 gRPC client and server from `proto/`, with the `protoc` that
//! ships inside the `protoc-bin-vendored` crate (or `$PROTOC` when set), so nothing needs
//! installing on the build machine.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var_os("PROTOC").is_none() {
        std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?);
    }
    println!("cargo:rerun-if-changed=proto/grpc_service.proto");
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Tensor contents as `Bytes`: raw contents pass between HTTP and gRPC without copies.
        .bytes(".")
        // A message that does not decode is the sender's mistake: INVALID_ARGUMENT.
        .codec_path("crate::protocol::grpc::codec::Codec")
        .compile_protos(&["proto/grpc_service.proto"], &["proto"])?;
    Ok(())
}
