//! Field paths and resource fields (upstream's `fieldpath` and
//! `resource` helpers): the values `fieldRef` and `resourceFieldRef`
//! give, for environment variables and downwardAPI volumes alike.

use k8s_openapi::api::core::v1::{Container, Pod};

use super::util::{NodeFacts, quantity_milli};

pub fn field_ref(pod: &Pod, path: &str, node: &NodeFacts) -> Option<String> {
    let m = &pod.metadata;
    Some(match path {
        "metadata.name" => m.name.clone()?,
        "metadata.namespace" => m.namespace.clone().unwrap_or_else(|| "default".into()),
        "metadata.uid" => m.uid.clone()?,
        "spec.nodeName" => node.node_name.clone(),
        "spec.serviceAccountName" => pod
            .spec
            .as_ref()?
            .service_account_name
            .clone()
            .unwrap_or_default(),
        "status.hostIP" | "status.podIP" => node.node_ip.clone(),
        p if p.starts_with("metadata.labels['") => {
            let k = p
                .trim_start_matches("metadata.labels['")
                .trim_end_matches("']");
            m.labels.as_ref()?.get(k)?.clone()
        }
        p if p.starts_with("metadata.annotations['") => {
            let k = p
                .trim_start_matches("metadata.annotations['")
                .trim_end_matches("']");
            m.annotations.as_ref()?.get(k)?.clone()
        }
        _ => return None,
    })
}

/// A `resourceFieldRef` value: the request or limit over its divisor,
/// rounded up.
pub fn resource_field(
    c: &Container,
    r: &k8s_openapi::api::core::v1::ResourceFieldSelector,
    node: &NodeFacts,
) -> String {
    let res = c.resources.clone().unwrap_or_default();
    let (kind, key) = match r.resource.split_once('.') {
        Some((k, key)) => (k, key),
        None => ("limits", r.resource.as_str()),
    };
    let map = if kind == "requests" {
        res.requests
    } else {
        res.limits
    }
    .unwrap_or_default();
    // No divisor, or a zero one (what the apiserver's defaults leave), is
    // 1, as upstream's ExtractContainerResourceValue reads it.
    let divisor = r
        .divisor
        .as_ref()
        .map(|d| quantity_milli(&d.0))
        .filter(|d| *d > 0)
        .unwrap_or(1000);
    match map.get(key) {
        Some(q) => quantity_milli(&q.0).div_ceil(divisor).to_string(),
        // Unset limits read as the node's allocatable upstream; kinglet
        // gives the node's memory and CPUs.
        None if key == "memory" => (u128::from(node.memory_capacity) * 1000)
            .div_ceil(divisor)
            .to_string(),
        None if key == "cpu" => u128::from(node.cpu_capacity_milli)
            .div_ceil(divisor)
            .to_string(),
        None => "0".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_fields_default_to_the_node_and_a_zero_divisor_is_one() {
        use k8s_openapi::api::core::v1::ResourceFieldSelector;
        use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
        let node = NodeFacts {
            cpu_capacity_milli: 2000,
            memory_capacity: 1 << 30,
            ..Default::default()
        };
        let c: Container = serde_json::from_value(serde_json::json!({
            "name": "c", "resources": {"limits": {"cpu": "1250m"}}
        }))
        .unwrap();
        let sel = |r: &str, d: Option<&str>| ResourceFieldSelector {
            resource: r.into(),
            divisor: d.map(|d| Quantity(d.into())),
            ..Default::default()
        };
        assert_eq!(
            resource_field(&c, &sel("limits.cpu", Some("0")), &node),
            "2"
        );
        assert_eq!(
            resource_field(&c, &sel("limits.cpu", Some("1m")), &node),
            "1250"
        );
        let unset = Container::default();
        assert_eq!(resource_field(&unset, &sel("limits.cpu", None), &node), "2");
        assert_eq!(
            resource_field(&unset, &sel("limits.memory", Some("1Mi")), &node),
            "1024"
        );
    }
}
