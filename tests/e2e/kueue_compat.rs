//! kaccel's start-up check of the cluster's Kueue (`kaccel::kueue::compat`) against
//! the CRDs the real Kueue installed: they pass; each field kaccel needs, taken out
//! of them, is named; and `kaccel run` on a Kueue whose CRD lacks one refuses to
//! start, saying which field and what to install.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kaccel::kueue::compat::{self, Incompatible};
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};

use crate::controller::{Controller, free_port};
use crate::support::{client, serial, unique};

/// The JSON pointer of `field` (dot-separated, `[]` into items) in the `v1beta2`
/// schema of `crd`.
fn pointer_of(crd: &Value, field: &str) -> String {
    let index = crd["spec"]["versions"]
        .as_array()
        .unwrap()
        .iter()
        .position(|v| v["name"] == "v1beta2")
        .expect("v1beta2 in the CRD");
    let mut pointer = format!("/spec/versions/{index}/schema/openAPIV3Schema");
    for step in field.split('.') {
        match step.strip_suffix("[]") {
            Some(name) => pointer += &format!("/properties/{name}/items"),
            None => pointer += &format!("/properties/{step}"),
        }
    }
    pointer
}

/// `crd` without `field` (its last step removed from its parent's properties).
fn without(crd: &Value, field: &str) -> Value {
    let pointer = pointer_of(crd, field);
    let (parent, leaf) = pointer.rsplit_once('/').unwrap();
    let mut copy = crd.clone();
    let removed = copy
        .pointer_mut(parent)
        .and_then(Value::as_object_mut)
        .and_then(|p| p.remove(leaf));
    assert!(removed.is_some(), "{field} is in the served schema");
    copy
}

#[tokio::test]
async fn the_served_kueue_passes_and_one_without_a_field_kaccel_uses_is_refused_at_start() {
    let _serial = serial().await;
    let client = client().await;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut live: Vec<Value> = Vec::new();
    for (name, _) in compat::REQUIRED_FIELDS {
        let crd = crds.get(name).await.unwrap();
        live.push(serde_json::to_value(crd).unwrap());
    }
    let typed = |values: &[Value]| -> Vec<CustomResourceDefinition> {
        values
            .iter()
            .map(|v| serde_json::from_value(v.clone()).unwrap())
            .collect()
    };
    let check = |crds: &[CustomResourceDefinition]| {
        compat::check(|name| {
            crds.iter()
                .find(|c| c.metadata.name.as_deref() == Some(name))
        })
    };
    assert_eq!(check(&typed(&live)), vec![], "the harness's Kueue passes");

    // Each field, taken out of the real CRD, is the one problem named.
    for (at, (crd_name, fields)) in compat::REQUIRED_FIELDS.iter().enumerate() {
        for field in *fields {
            let mut edited = live.clone();
            edited[at] = without(&live[at], field);
            assert_eq!(
                check(&typed(&edited)),
                vec![Incompatible::MissingField {
                    crd: crd_name.to_string(),
                    field: field.to_string()
                }]
            );
        }
    }

    // For real: the LocalQueue CRD loses spec.stopPolicy (as a Kueue before it had
    // it would lack it); kaccel run refuses to start and says why.
    let crd_name = "localqueues.kueue.x-k8s.io";
    let at = compat::REQUIRED_FIELDS
        .iter()
        .position(|(n, _)| *n == crd_name)
        .unwrap();
    let pointer = pointer_of(&live[at], "spec.stopPolicy");
    let removed = live[at].pointer(&pointer).unwrap().clone();
    let params = PatchParams::default();
    crds.patch(
        crd_name,
        &params,
        &Patch::<()>::Json(
            serde_json::from_value(json!([
                {"op": "test", "path": pointer, "value": removed},
                {"op": "remove", "path": pointer}
            ]))
            .unwrap(),
        ),
    )
    .await
    .unwrap();
    let outcome = refused_start().await;
    // Put the field back before anything else can fail.
    crds.patch(
        crd_name,
        &params,
        &Patch::<()>::Json(
            serde_json::from_value(json!([{"op": "add", "path": pointer, "value": removed}]))
                .unwrap(),
        ),
    )
    .await
    .expect("restoring the LocalQueue CRD");
    let (exit, log) = outcome.unwrap();
    assert!(!exit.success(), "kaccel exits with an error: {log}");
    assert!(
        log.contains(
            "CustomResourceDefinition localqueues.kueue.x-k8s.io v1beta2 has no field spec.stopPolicy, which kaccel uses: upgrade Kueue to v0.16 or v0.17"
        ),
        "the log names the CRD, the field and the fix:\n{log}"
    );
    assert!(
        !log.contains("caches synced") && !log.contains("applied"),
        "nothing was watched or written before the refusal:\n{log}"
    );

    // And with the field back, the same start passes the check.
    let mut controller = Controller::start(&unique("compat-ok"), free_port(), CONFIG);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let log = std::fs::read_to_string(&controller.log).unwrap_or_default();
        if log.contains("Kueue's CRDs serve every field kaccel uses") {
            break;
        }
        assert!(controller.is_running(), "kaccel stopped:\n{log}");
        assert!(Instant::now() < deadline, "no check result in 30 s:\n{log}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    controller.kill();
}

const CONFIG: &str =
    "rootCohort: kaccel-compat\nwatchResourceSlices: false\nleaderElection:\n  enabled: false\n";

/// Starts kaccel and waits (30 s at most) for it to exit: its status and log.
async fn refused_start() -> Result<(std::process::ExitStatus, String)> {
    let mut controller = Controller::start(&unique("compat"), free_port(), CONFIG);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = controller.try_exit()? {
            let log = std::fs::read_to_string(&controller.log).unwrap_or_default();
            return Ok((status, log));
        }
        if Instant::now() > deadline {
            let log = controller.log_tail();
            controller.kill();
            return Err(anyhow::anyhow!("kaccel still running after 30 s:\n{log}"))
                .context("waiting for the refusal");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
