//! Compiles the kubelet's contracts with protox (a pure-Rust protobuf compiler), so building needs
//! no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/dra/v1/dra.proto",
        "proto/dra/v1beta1/dra.proto",
        "proto/pluginregistration/v1/registration.proto",
        "proto/health/v1alpha1/health.proto",
        "proto/health/v1/health.proto",
    ];
    for f in &files {
        println!("cargo:rerun-if-changed={f}");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure().build_client(true).build_server(true).compile_fds(descriptors)?;
    Ok(())
}
