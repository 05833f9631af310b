//! kaccel's own identity: the ServiceAccount, RBAC and node guard of manifests/
//! (installed by e2e/cluster.sh, token from a TokenRequest) let it do what it does
//! and nothing more, and a denial it meets at run time is logged with the fix and
//! counted, never a crash loop.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Namespace, Node, Secret};
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use serde_json::json;

use crate::controller::{Controller, free_port, metric_sum};
use crate::support::{self, controller_kubeconfig};

/// A client holding only kaccel's token.
async fn kaccel_client() -> Client {
    let kubeconfig = Kubeconfig::read_from(controller_kubeconfig()).unwrap();
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    Client::try_from(config).unwrap()
}

/// The API server's answer is a 403 (RBAC or the node guard), with its message.
fn forbidden<T: std::fmt::Debug>(what: &str, result: kube::Result<T>) -> Result<String> {
    match result {
        Err(kube::Error::Api(status)) if status.code == 403 => Ok(status.message),
        other => bail!("{what}: expected 403 Forbidden, got {other:?}"),
    }
}

#[tokio::test]
async fn kaccel_may_do_its_job_and_nothing_more() {
    let _serial = support::serial().await;
    let admin = support::client().await;
    let kaccel = kaccel_client().await;
    kaccel
        .apiserver_version()
        .await
        .expect("kaccel's token authenticates");

    // Secrets: none to list, none to read (only its own webhook Secret by name).
    let message = forbidden(
        "list Secrets",
        Api::<Secret>::all(kaccel.clone())
            .list(&ListParams::default())
            .await,
    )
    .unwrap();
    assert!(
        message.contains("system:serviceaccount:kaccel-system:kaccel"),
        "{message}"
    );
    forbidden(
        "read a Secret of kueue-system",
        Api::<Secret>::namespaced(kaccel.clone(), "kueue-system")
            .get("kueue-webhook-server-cert")
            .await,
    )
    .unwrap();
    // Deleting a Namespace, binding itself a role: refused (dry runs, so a
    // regression here still changes nothing).
    forbidden(
        "delete a Namespace",
        Api::<Namespace>::all(kaccel.clone())
            .delete("default", &DeleteParams::default().dry_run())
            .await,
    )
    .unwrap();
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "kaccel-escalates"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": "kaccel", "namespace": "kaccel-system"}]
    }))
    .unwrap();
    forbidden(
        "bind cluster-admin",
        Api::<ClusterRoleBinding>::all(kaccel.clone())
            .create(
                &PostParams {
                    dry_run: true,
                    field_manager: None,
                },
                &binding,
            )
            .await,
    )
    .unwrap();

    // Nodes: RBAC grants patch (the cordon and taint); the node guard holds it to
    // kaccel's fields. A label change is refused, a cordon passes.
    let name = support::unique("guarded");
    let nodes_admin: Api<Node> = Api::all(admin.clone());
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"kaccel-e2e/guard": "1"}}
    }))
    .unwrap();
    nodes_admin
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
    let nodes: Api<Node> = Api::all(kaccel.clone());
    let dry = PatchParams::default().dry_run();
    let outcome = async {
        // The policy takes effect once the API server has read it (just installed
        // by cluster.sh): retried for a few seconds.
        let deadline = Instant::now() + Duration::from_secs(20);
        let message = loop {
            let label = nodes
                .patch(
                    &name,
                    &dry,
                    &Patch::Merge(json!({"metadata": {"labels": {"kaccel-e2e/guard": "2"}}})),
                )
                .await;
            match label {
                Err(kube::Error::Api(s)) if s.code == 403 => break s.message,
                _ if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(500)).await,
                other => bail!("a label change by kaccel: expected 403, got {other:?}"),
            }
        };
        if !message.contains("kaccel may not change a Node's labels") {
            bail!("the node guard says why: {message}");
        }
        let other_taint = nodes
            .patch(
                &name,
                &dry,
                &Patch::Merge(json!({"spec": {"taints": [{"key": "other", "effect": "NoSchedule"}]}})),
            )
            .await;
        forbidden("another taint", other_taint)?;
        nodes
            .patch(
                &name,
                &dry,
                &Patch::Merge(json!({
                    "spec": {"unschedulable": true, "taints": [{"key": "kaccel.io/unhealthy", "effect": "NoSchedule"}]},
                    "metadata": {"annotations": {"kaccel.io/tainted": "x"}}
                })),
            )
            .await
            .context("kaccel's own cordon, taint and annotation pass the guard")?;
        anyhow::Ok(())
    }
    .await;
    nodes_admin
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    outcome.unwrap();
}

/// Leader election configured in a namespace kaccel's Role does not cover: kaccel
/// says so with the fix, counts it and retries; it never exits (a crash loop).
#[tokio::test]
async fn a_lease_kaccel_may_not_take_is_logged_counted_and_retried_not_a_crash_loop() {
    let _serial = support::serial().await;
    let config = "rootCohort: kaccel-identity\nwatchResourceSlices: false\nleaderElection:\n  enabled: true\n  leaseName: kaccel-controller\n  leaseNamespace: default\n";
    let mut controller = Controller::start(&support::unique("denied"), free_port(), config);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(
            controller.is_running(),
            "kaccel exited:\n{}",
            controller.log_tail()
        );
        let failures = controller
            .metrics()
            .map(|m| {
                metric_sum(
                    &m,
                    "kaccel_leader_election_failures_total{reason=\"Forbidden\"}",
                )
            })
            .unwrap_or(0);
        if failures >= 3 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{failures} counted failures in 60 s:\n{}",
            controller.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let log = std::fs::read_to_string(&controller.log).unwrap();
    assert!(
        log.contains("may not create or read the leader-election Lease: manifests/role.yaml grants kaccel the Lease kaccel-controller in its own namespace")
            && log.contains("forbidden"),
        "the log names the denial and the fix:\n{log}"
    );
    assert!(!controller.is_leader(), "never leads without its Lease");
    assert!(
        !log.contains("became leader") && !log.contains("applied"),
        "writes nothing without its Lease:\n{log}"
    );
    controller.kill();
}
