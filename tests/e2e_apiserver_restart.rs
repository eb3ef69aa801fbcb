//! End to end: the API server dies and comes back; kinglet keeps running
//! (same process), keeps /healthz ok, and the node is Ready again with its
//! Lease renewed. Its own test binary, so no other test sees the outage.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;

#[tokio::test]
async fn node_survives_an_apiserver_restart() {
    let admin = admin().await;
    let nodes: Api<Node> = Api::all(admin.clone());
    let name = unique_name("kl-apirestart");
    let mut k = Kinglet::start(&name, FAST_CONFIG);
    wait_ready(&nodes, &name, Duration::from_secs(20)).await;
    let pid = k.pid();

    // SIGKILL: no goodbye to clients, as in a crash.
    // SAFETY: kill(2) on the component pid that up.sh recorded.
    unsafe { libc::kill(component_pid("kube-apiserver"), libc::SIGKILL) };
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(
        k.alive(),
        "kinglet exited while the API server was down\n{}",
        k.log()
    );
    assert_eq!(
        k.healthz().await,
        Some(200),
        "healthz failed during the outage"
    );
    assert!(
        k.log().contains("will retry"),
        "no retry logged\n{}",
        k.log()
    );

    let down_until = jiff::Timestamp::now();
    cluster_up_again();
    let admin = common::admin().await;
    let nodes: Api<Node> = Api::all(admin.clone());
    let leases: Api<Lease> = Api::namespaced(admin, "kube-node-lease");
    wait_for(
        "lease renewed after the restart",
        Duration::from_secs(30),
        || async {
            let t = leases.get(&name).await.ok()?.spec?.renew_time?.0;
            (t > down_until).then_some(())
        },
    )
    .await;
    wait_ready(&nodes, &name, Duration::from_secs(20)).await;
    assert!(k.alive());
    assert_eq!(k.pid(), pid);
}
