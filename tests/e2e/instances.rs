//! Two kaccel installations side by side in one cluster (issue 11, item 3): the
//! default instance and another, each with its own classes, budgets, ledger,
//! AdmissionCheck, finalizer, field manager and Lease, both under the
//! manifests' ServiceAccount. Neither writes, deletes or charges what the other
//! owns; an object of a name one plans that the other owns gets a Conflict
//! condition naming the owner and is left unchanged.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::rbac::v1::Role;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams};
use kube::core::ApiResource;
use serde_json::{Value, json};

use crate::controller::{Controller, cq_flavors, free_port, wait_for, wait_obj};
use crate::ledger::{self, CHECK, Env, FINALIZER, WAIT, with_env};
use crate::support::{self, kueue};

/// The finalizers on a Workload.
fn finalizers(wl: &Value) -> Vec<String> {
    wl["metadata"]["finalizers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f.as_str().map(str::to_string))
        .collect()
}

/// The state of the AdmissionCheck `check` on a Workload.
fn check_state<'a>(wl: &'a Value, check: &str) -> Option<&'a str> {
    wl["status"]["admissionChecks"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == check)?["state"]
        .as_str()
}

/// The AdmissionChecks a ClusterQueue's strategy names.
fn strategy(cq: &Value) -> Vec<&str> {
    cq["spec"]["admissionChecksStrategy"]["admissionChecks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str())
        .collect()
}

/// Every field manager that wrote an object.
fn writers(obj: &Value) -> Vec<String> {
    obj["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["manager"].as_str().map(str::to_string))
        .collect()
}

/// Kueue objects of every kind kaccel writes whose managed-by is `instance`.
async fn managed_by(client: &kube::Client, instance: &str) -> Result<Vec<(String, Value)>> {
    let mut out = Vec::new();
    let selector =
        ListParams::default().labels(&format!("app.kubernetes.io/managed-by={instance}"));
    for kind in [
        "ResourceFlavor",
        "Cohort",
        "ClusterQueue",
        "LocalQueue",
        "AdmissionCheck",
    ] {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &kueue(kind));
        for o in api.list(&selector).await?.items {
            let name = format!(
                "{kind} {}/{}",
                o.metadata.namespace.clone().unwrap_or_default(),
                o.metadata.name.clone().unwrap_or_default()
            );
            out.push((name, serde_json::to_value(o)?));
        }
    }
    Ok(out)
}

#[tokio::test]
async fn two_installations_never_touch_each_others_objects() {
    let dir = tempfile::tempdir().unwrap();
    let store_a = format!("sqlite:{}", dir.path().join("a.db").display());
    let store_b = format!("sqlite:{}", dir.path().join("b.db").display());
    with_env!("inst", |env| two_installations(
        &mut env, &store_a, &store_b
    )
    .await);
}

async fn two_installations(env: &mut Env, store_a: &str, store_b: &str) -> Result<()> {
    let id = env.id.clone();
    let client = env.client.clone();
    let b = format!("kb-{id}");
    let b_check = format!("{b}-credits");
    let b_finalizer = format!("kaccel.io/credits-{b}");
    let b_lease = format!("{b}-controller");

    // Installation A (the default instance): an H100 class and a budget, as
    // every other ledger test has them.
    let (class_a, budget_a, ns_a) = (format!("h100-{id}"), format!("ta-{id}"), format!("na-{id}"));
    env.class(&class_a).await?;
    env.budget(&budget_a, "team-a", &ns_a, &class_a, "1000000")
        .await?;
    env.start(store_a);
    let cq_a = format!("{budget_a}-{class_a}");
    let cq_a_obj = wait_obj(&env.cqs, &cq_a, "A's ClusterQueue with A's check", |o| {
        strategy(o) == [CHECK]
    })
    .await?;
    let h100_flavor = cq_flavors(&cq_a_obj)
        .first()
        .cloned()
        .context("A's ClusterQueue has a flavor")?;

    // Installation B: labelled classes and budgets. class_b is MI300X; overlap
    // is an H100 class of B's, whose flavor name is A's H100 flavor; stray is a
    // budget of B's naming A's class.
    let (class_b, budget_b, ns_b) = (format!("mi-{id}"), format!("tb-{id}"), format!("nb-{id}"));
    let overlap = format!("h100b-{id}");
    let (stray, ns_stray) = (format!("stray-{id}"), format!("ns-stray-{id}"));
    let label = |mut o: Value| {
        o["metadata"]["labels"] = json!({"kaccel.io/instance": b});
        o
    };
    env.create_class(label(json!({
        "apiVersion": "kaccel.io/v1alpha1", "kind": "AcceleratorClass",
        "metadata": { "name": class_b },
        "spec": { "sharing": "Whole", "selector": { "vendors": ["amd"] },
                  "credits": { "perDeviceHour": "3600" } }
    })))
    .await?;
    env.create_class(label(ledger::h100_class(&overlap)))
        .await?;
    env.create_budget(label(ledger::budget(
        &budget_b, "team-b", &ns_b, &class_b, "1000000",
    )))
    .await?;
    env.create_budget(label(ledger::budget(
        &stray, "team-s", &ns_stray, &class_a, "1000000",
    )))
    .await?;
    for cohort in [b.clone(), format!("{b}-{budget_b}"), format!("{b}-{stray}")] {
        env.cleanup.add(None, kueue("Cohort"), &cohort);
    }
    env.cleanup.add(None, kueue("AdmissionCheck"), &b_check);
    // B's Lease: granted as manifests/role.yaml grants A's (an overlay of a
    // second installation names its own Lease).
    let role_text = include_str!("../../manifests/role.yaml")
        .split("\n---\n")
        .next()
        .context("the leader-election Role")?
        .replace("kaccel-controller", &b_lease);
    let mut role: Role = serde_yaml::from_str(&role_text)?;
    role.metadata.name = Some(format!("{b}-leader-election"));
    support::grant_kaccel(&client, &mut env.cleanup, &role).await?;
    env.cleanup.add(
        Some("kaccel-system"),
        ApiResource::erase::<Lease>(&()),
        &b_lease,
    );

    let config_b = format!(
        "instance: {b}\nleaderElection:\n  enabled: true\n  leaseDurationSeconds: 6\n  renewGraceSeconds: 2\n\
         watchResourceSlices: false\ndebounceMs: 100\nmaxDelayMs: 500\nledger:\n  enabled: true\n  \
         store: {store_b}\n  budgetIntervalSeconds: 2\n  retryAfterSeconds: 3\n  postIntervalSeconds: 60\n"
    );
    let mut controller_b = Controller::start(&format!("b-{id}"), free_port(), &config_b);
    let result = async {
        // B writes its own queue, on its own flavor, with its own check.
        let cq_b = format!("{budget_b}-{class_b}");
        let cq_b_obj = wait_obj(&env.cqs, &cq_b, "B's ClusterQueue with B's check", |o| {
            strategy(o) == [b_check.as_str()]
                && o["metadata"]["labels"]["app.kubernetes.io/managed-by"] == b.as_str()
        })
        .await?;
        let mi_flavor = cq_flavors(&cq_b_obj)
            .first()
            .cloned()
            .context("B's ClusterQueue has a flavor")?;
        // Deleted after the queues that use it: no controller of B's is left to.
        env.cleanup
            .add_last(None, kueue("ResourceFlavor"), &mi_flavor);
        ensure!(mi_flavor != h100_flavor, "B's flavor is A's: {mi_flavor}");
        assert_eq!(cq_b_obj["spec"]["cohortName"], format!("{b}-{budget_b}"));

        // B's H100 class plans A's flavor name: a Conflict naming A, and A's
        // flavor left as A wrote it.
        let classes: Api<DynamicObject> = Api::all_with(client.clone(), &ledger::class_ar());
        let conflicted = wait_obj(&classes, &overlap, "Conflict naming A's flavor", |o| {
            support::condition(o, "Conflict").is_some_and(|c| {
                c["status"] == "True"
                    && c["message"]
                        .as_str()
                        .is_some_and(|m| m.contains(&format!("ResourceFlavor {h100_flavor}")))
            })
        })
        .await?;
        let message = support::condition(&conflicted, "Conflict").unwrap()["message"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(
            message.contains("managed by kaccel,") && message.contains(&class_a),
            "the Conflict names the owner: {message}"
        );
        // B's budget naming A's class: told whose class it is.
        let budget_of_b = wait_obj(&env.budgets, &stray, "ClassOfAnotherInstallation", |o| {
            o["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["reason"] == "ClassOfAnotherInstallation")
        })
        .await?;
        assert!(
            budget_of_b
                .to_string()
                .contains("served by the kaccel installation \\\"kaccel\\\""),
            "{budget_of_b}"
        );

        // One Workload per installation: each admitted by its own check, carrying
        // its own finalizer only, charged in its own ledger only.
        let wl_a = env
            .workload(&ns_a, &format!("wa-{id}"), &class_a, 600)
            .await?;
        let wl_b = env
            .create_workload(ledger::device_workload(
                &ns_b,
                &format!("wb-{id}"),
                &class_b,
                "amd.com/gpu",
                1,
                Some(600),
            ))
            .await?;
        let name = |w: &Value| {
            w["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        };
        let uid = |w: &Value| {
            w["metadata"]["uid"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        };
        let a = wait_obj(&env.workloads(&ns_a), &name(&wl_a), "admitted by A", |w| {
            support::is_true(w, "Admitted") && check_state(w, CHECK) == Some("Ready")
        })
        .await?;
        let bw = wait_obj(&env.workloads(&ns_b), &name(&wl_b), "admitted by B", |w| {
            support::is_true(w, "Admitted") && check_state(w, &b_check) == Some("Ready")
        })
        .await?;
        assert_eq!(finalizers(&a), [FINALIZER], "A's Workload");
        assert_eq!(finalizers(&bw), [b_finalizer.as_str()], "B's Workload");
        assert_eq!(check_state(&a, &b_check), None);
        assert_eq!(check_state(&bw, CHECK), None);
        let reserved = |store: &str, uid: String| -> Result<bool> {
            Ok(ledger::export(store, None)?
                .iter()
                .any(|e| e["workloadUid"] == uid.as_str() && e["kind"] == "Reserve"))
        };
        ensure!(reserved(store_a, uid(&a))? && !reserved(store_a, uid(&bw))?);
        ensure!(reserved(store_b, uid(&bw))? && !reserved(store_b, uid(&a))?);

        // Each ledger agrees with its own installation's queues.
        for (store, instance) in [(store_a, "kaccel"), (store_b, b.as_str())] {
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            loop {
                let out = ledger::kaccel(&[
                    "ledger",
                    "verify",
                    "--store",
                    store,
                    "--cluster",
                    "--instance",
                    instance,
                ])?;
                if out.status.success() {
                    break;
                }
                ensure!(
                    std::time::Instant::now() < deadline,
                    "ledger verify --cluster --instance {instance}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }

        // B holds its own Lease.
        let leases: Api<Lease> = Api::namespaced(client.clone(), "kaccel-system");
        let held = wait_for("B's Lease held", WAIT, || async {
            Ok(leases
                .get_opt(&b_lease)
                .await?
                .and_then(|l| l.spec?.holder_identity))
        })
        .await?;
        ensure!(held.contains(&format!("b-{id}")), "B's Lease holder {held}");

        // Nothing either installation owns was written by the other.
        let mine_a = managed_by(&client, "kaccel").await?;
        let mine_b = managed_by(&client, &b).await?;
        ensure!(
            mine_b.len() >= 6,
            "B's objects: {:?}",
            mine_b.iter().map(|o| &o.0).collect::<Vec<_>>()
        );
        for (what, obj) in &mine_a {
            let w = writers(obj);
            ensure!(
                !w.iter().any(|m| m.starts_with(&b)),
                "{what}, A's, was written by B: {w:?}"
            );
        }
        for (what, obj) in &mine_b {
            let w = writers(obj);
            ensure!(
                !w.iter().any(|m| m == "kaccel" || m == "kaccel-credits"),
                "{what}, B's, was written by A: {w:?}"
            );
        }
        let flavors: Api<DynamicObject> = Api::all_with(client.clone(), &kueue("ResourceFlavor"));
        let h100 = support::get_json(&flavors, &h100_flavor).await?;
        assert_eq!(
            h100["metadata"]["labels"]["app.kubernetes.io/managed-by"],
            "kaccel"
        );

        // B settles its own Workload; A had nothing to do with it.
        env.workloads(&ns_b)
            .delete(&name(&bw), &DeleteParams::background())
            .await?;
        let workloads_b = env.workloads(&ns_b);
        wait_for("B's Workload settled and gone", WAIT, || async {
            Ok(workloads_b
                .get_opt(&name(&bw))
                .await?
                .is_none()
                .then_some(()))
        })
        .await?;
        let posts = ledger::posts_of(store_b, &uid(&bw), WAIT).await?;
        ensure!(!posts.is_empty());
        ensure!(
            !ledger::export(store_a, None)?
                .iter()
                .any(|e| e["workloadUid"] == uid(&bw).as_str()),
            "A's ledger holds B's Workload"
        );

        // B stops: A's queue is still A's, unchanged in what A wrote.
        controller_b.kill();
        let after = support::get_json(&env.cqs, &cq_a).await?;
        assert_eq!(after["spec"], cq_a_obj["spec"]);
        Ok::<_, anyhow::Error>(())
    }
    .await;
    if result.is_err() {
        eprintln!("--- B's log tail ---\n{}", controller_b.log_tail());
    }
    drop(controller_b);
    result
}
