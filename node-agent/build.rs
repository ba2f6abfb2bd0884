//! Generates the Open Inference Protocol's gRPC service (Triton's `inference` package) from
//! `proto/`, compiled by protox so that no `protoc` binary is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/grpc_service.proto", "proto/model_config.proto"];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
