//! Compiles the kubelet's own gRPC APIs, copied verbatim from
//! `k8s.io/kubelet` (the release kinglet implements): the device plugin
//! API v1beta1 (kinglet serves `Registration` and is a client of each
//! plugin's `DevicePlugin`) and the pod resources API v1 (kinglet serves
//! `PodResourcesLister`). protox compiles them in Rust: no `protoc` is
//! needed on the build machine.

fn main() {
    let files = [
        "deviceplugin/v1beta1/api.proto",
        "podresources/v1/api.proto",
    ];
    for f in files {
        println!("cargo:rerun-if-changed=src/devices/proto/{f}");
    }
    let fds = match protox::compile(files, ["src/devices/proto"]) {
        Ok(fds) => fds,
        Err(e) => panic!("compiling the kubelet's protos: {e}"),
    };
    if let Err(e) = tonic_prost_build::configure()
        .build_transport(false)
        .compile_fds(fds)
    {
        panic!("generating the kubelet's gRPC services: {e}");
    }
}
