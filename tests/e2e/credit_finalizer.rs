//! The Workload webhook (manifests/webhook.yaml, `/mutate-workloads`): the
//! credit check's finalizer put on as a Workload is created, so the check
//! answers Kueue after one durable append and one status write, and writes the
//! reservation record once Kueue has admitted the Workload.

use anyhow::Result;
use kube::api::DeleteParams;
use serde_json::{Value, json};

use crate::class_requests::{
    TestWebhook, WORKLOAD_HOOK, dry_run_create, wait_for_workload_finalizer,
};
use crate::controller::{metric_sum, wait_for};
use crate::ledger::{
    Env, WAIT, admitted, check_message, expect, export, finish, has_finalizer, transition, verify,
    wait_figures, with_env, workload, workload_entries,
};
use crate::support;

/// JSON pointer of the reservation record annotation.
const RECORD: &str = "/metadata/annotations/kaccel.io~1credit-reservation";

#[tokio::test]
async fn the_workload_webhook_puts_the_finalizer_on_and_the_record_follows_admission() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("ledger.db").display());
    with_env!("lwh", |env| workload_webhook(&mut env, &store).await);
}

async fn workload_webhook(env: &mut Env, store: &str) -> Result<()> {
    let id = env.id.clone();
    let class = format!("h100-{id}");
    let (budget, team, ns) = (
        format!("wh-{id}"),
        format!("wh-team-{id}"),
        format!("wh-{id}"),
    );
    env.class(&class).await?;
    env.budget(&budget, &team, &ns, &class, "100").await?;
    let client = env.client.clone();
    let webhook =
        TestWebhook::register_hooks(&client, &mut env.cleanup, &ns, &[WORKLOAD_HOOK]).await?;
    let webhook_config = webhook.config.clone();
    env.start_with(store, |config| config + &webhook_config);
    webhook.wait_for_ca_bundle(&client).await?;
    wait_figures(&env.budgets, &budget, expect(100, 0, 0)).await?;

    let wl = env.workloads(&ns);
    let dry = |name: &str, queue: &str, active: bool| {
        let mut object = workload(&ns, name, queue, 60);
        object["spec"]["active"] = json!(active);
        object
    };
    wait_for_workload_finalizer(&wl, &dry("probe", &class, true)).await?;
    // A Workload bound for a queue kaccel does not charge is left alone, and so
    // is one created inactive (it may never run).
    let elsewhere = dry_run_create(&wl, &dry("elsewhere", &format!("not-{class}"), true)).await?;
    assert!(!has_finalizer(&elsewhere), "{elsewhere}");
    let inactive = dry_run_create(&wl, &dry("inactive", &class, false)).await?;
    assert!(!has_finalizer(&inactive), "{inactive}");

    // W1 carries the finalizer from its creation, and no record yet.
    let created = env.workload(&ns, "w1", &class, 60).await?;
    assert!(has_finalizer(&created), "{created}");
    assert!(created.pointer(RECORD).is_none(), "{created}");
    let w1 =
        support::wait_until(&wl, "w1", "admitted with the check Ready", WAIT, admitted).await?;
    let msg = check_message(&w1);
    assert!(
        msg.starts_with(&format!(
            "reserved 60 credits of budget {budget} for up to 60s"
        )),
        "{msg}"
    );
    // The record follows Kueue's admission, rebuilt from the Reserve entry.
    let w1 = support::wait_until(&wl, "w1", "the record after Admitted", WAIT, |o| {
        o.pointer(RECORD).is_some()
    })
    .await?;
    let record: Value = serde_json::from_str(
        w1.pointer(RECORD)
            .and_then(Value::as_str)
            .unwrap_or_default(),
    )?;
    assert_eq!(
        (
            &record["admission"],
            &record["budget"],
            &record["horizonSeconds"],
            &record["lines"][0]["deviceUnits"]
        ),
        (&json!(1), &json!(budget), &json!(60), &json!(1)),
        "{record}"
    );
    // The check answered without writing the record first: no `record` stage,
    // one `append`.
    let metrics = env.controller().metrics().unwrap_or_default();
    let stage = |s: &str| {
        metric_sum(
            &metrics,
            &format!("kaccel_admission_check_stage_seconds_count{{stage=\"{s}\"}}"),
        )
    };
    assert_eq!((stage("record"), stage("append")), (0, 1), "{metrics}");
    assert!(
        metric_sum(
            &metrics,
            "kaccel_workload_webhook_answers_total{answer=\"finalizer\"}"
        ) >= 2,
        "{metrics}"
    );

    // W2 needs 60 of the 40 left: it waits with the finalizer and nothing
    // written; deleted while it waits, it goes (kaccel releases the finalizer)
    // and the ledger holds nothing of it.
    let w2 = env.workload(&ns, "w2", &class, 60).await?;
    let w2_uid = w2["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    support::wait_until(&wl, "w2", "waiting for credits", WAIT, |o| {
        check_message(o).contains("credits left")
    })
    .await?;
    let w2 = support::get_json(&wl, "w2").await?;
    assert!(has_finalizer(&w2), "{w2}");
    assert!(w2.pointer(RECORD).is_none(), "{w2}");
    wl.delete("w2", &DeleteParams::default()).await?;
    wait_for("W2 deleted", WAIT, || async {
        Ok(wl.get_opt("w2").await?.is_none().then_some(()))
    })
    .await?;

    // W1 ends: charged exactly its run time, settled, the finalizer released.
    let reserved_at = transition(&w1, "QuotaReserved")?;
    let finished_at = finish(&wl, "w1").await?;
    let spent = finished_at - reserved_at;
    support::wait_until(&wl, "w1", "finalizer removed", WAIT, |o| !has_finalizer(o)).await?;
    wait_figures(&env.budgets, &budget, expect(100, 0, spent)).await?;
    let entries = export(store, Some(&budget))?;
    assert!(
        workload_entries(&entries, &w2_uid).is_empty(),
        "W2 was never reserved: {entries:?}"
    );
    let (ok, out) = verify(store)?;
    assert!(ok, "{out}");
    Ok(())
}
