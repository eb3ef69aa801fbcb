//! Compiles CRI's `runtime.v1` API (`proto/api.proto`, copied verbatim from
//! `k8s.io/cri-api` v0.37.2, the release kinglet implements) into a tonic
//! client with protox: no `protoc` is needed on the build machine.

fn main() {
    println!("cargo:rerun-if-changed=proto/api.proto");
    let fds = match protox::compile(["api.proto"], ["proto"]) {
        Ok(fds) => fds,
        Err(e) => panic!("compiling proto/api.proto: {e}"),
    };
    if let Err(e) = tonic_prost_build::configure()
        .build_server(false)
        .build_transport(false)
        .compile_fds(fds)
    {
        panic!("generating the CRI client: {e}");
    }
}
