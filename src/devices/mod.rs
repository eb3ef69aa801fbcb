//! Devices (upstream's `cm/devicemanager` and its neighbours): the device
//! manager that turns device sources into extended resources and gives
//! devices to containers at admission ([`manager`], the pure choice in
//! [`allocate`], the crash-safe [`checkpoint`]); its sources: device
//! plugins registering on `kubelet.sock` ([`plugin`]) and kinglet's
//! built-in device classes declared by path ([`builtin`]); and the pod
//! resources API that tells monitoring agents which pod holds what
//! ([`podresources`]), both gRPC servers on unix sockets ([`grpc`]).

pub mod allocate;
pub mod builtin;
pub mod checkpoint;
mod grpc;
pub mod manager;
pub mod plugin;
pub mod podresources;

pub use manager::{AllocateError, DeviceManager};

/// Upstream's `IsExtendedResourceName`: a domain-qualified name outside
/// `kubernetes.io/` that stays a qualified name with `requests.` before
/// it (what a device plugin may register, what a device class may be).
pub fn validate_resource_name(name: &str) -> Result<(), String> {
    let native = !name.contains('/') || name.contains("kubernetes.io/");
    if native || name.starts_with("requests.") {
        return Err(format!(
            "{name:?} is not an extended resource name (domain/name, outside kubernetes.io)"
        ));
    }
    crate::config::validate_qualified_name(&format!("requests.{name}"))
        .map_err(|e| format!("{name:?} is not a valid resource name: {e}"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn extended_resource_names_as_upstream() {
        use super::validate_resource_name as v;
        assert!(v("example.com/resource").is_ok());
        assert!(v("devices.kinglet.io/serial").is_ok());
        assert!(v("resource").is_err());
        assert!(v("kubernetes.io/x").is_err());
        assert!(v("requests.example.com/x").is_err());
        assert!(v("Example.com/x").is_err());
        assert!(v("example.com/").is_err());
    }
}
