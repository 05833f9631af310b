//! `kaccel inventory --device UUID`: one card's story. Its health now and its last
//! status changes (from a running controller, `--health-from`), and the admissions
//! that held it (from the ledger, `--store`): "which jobs ran on GPU-xxxx last week".

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::{DeviceHealth, InventoryError, InventoryOutput};
use crate::health::policy::{DeviceView, Transition};
use crate::ledger::entry::{EntryKind, format_micros};
use crate::ledger::store::{EntryFilter, StoreError, for_each_entry};

/// What is known of one device.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceReport {
    pub device: String,
    /// The controller's view of it (`--health-from`), if it tracks it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub health: Option<DeviceView>,
    /// Admissions whose charged entries name it (`--store`), newest first.
    pub holders: Vec<HeldBy>,
    /// What was not read, and why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// One admission that held the device, as the ledger recorded it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HeldBy {
    pub namespace: String,
    pub workload: String,
    pub workload_uid: String,
    pub admission: u32,
    pub team: String,
    pub budget: String,
    pub class: String,
    pub flavor: String,
    /// The span its posts naming the device cover (Unix seconds).
    pub from: i64,
    pub to: i64,
    /// Micro-credits posted in those entries (all devices of the admission).
    pub credits: i64,
}

/// Fold the posts naming a device into one row per admission, newest first.
pub fn holders_of<'a>(
    posts: impl IntoIterator<Item = &'a crate::ledger::entry::Entry>,
) -> Vec<HeldBy> {
    let mut by_admission: BTreeMap<(String, u32), HeldBy> = BTreeMap::new();
    for e in posts.into_iter().filter(|e| e.kind == EntryKind::Post) {
        let row = by_admission
            .entry((e.workload_uid.clone(), e.admission))
            .or_insert_with(|| HeldBy {
                namespace: e.namespace.clone(),
                workload: e.workload.clone(),
                workload_uid: e.workload_uid.clone(),
                admission: e.admission,
                team: e.team.clone(),
                budget: e.budget.clone(),
                class: e.class.clone(),
                flavor: e.flavor.clone(),
                from: e.start,
                to: e.end,
                credits: 0,
            });
        row.from = row.from.min(e.start);
        row.to = row.to.max(e.end);
        row.credits = row.credits.saturating_add(e.credits);
    }
    let mut rows: Vec<HeldBy> = by_admission.into_values().collect();
    rows.sort_by(|a, b| b.to.cmp(&a.to).then_with(|| a.workload.cmp(&b.workload)));
    rows
}

/// Read what `--health-from` and `--store` know of `device` since `since`.
pub async fn read(
    device: &str,
    health_from: Option<&str>,
    store: Option<&str>,
    since: i64,
) -> Result<DeviceReport, InventoryError> {
    let mut report = DeviceReport {
        device: device.to_string(),
        ..Default::default()
    };
    match health_from {
        Some(address) => {
            let health: DeviceHealth = super::gather::fetch_device_health(address).await?;
            report.health = health.devices.into_iter().find(|v| {
                v.device.device == device || v.device.reading.uuid.as_deref() == Some(device)
            });
            if report.health.is_none() {
                report.notes.push(format!(
                    "the controller at {address} does not track {device}"
                ));
            }
        }
        None => report
            .notes
            .push("health not read: pass --health-from http://<kaccel>:8080".into()),
    }
    match store {
        Some(url) => {
            let store = crate::ledger::store::Store::open(url)
                .await
                .map_err(|e| InventoryError::Ledger(e.to_string()))?;
            let filter = EntryFilter {
                from: Some(since),
                device: Some(device.to_string()),
                ..EntryFilter::default()
            };
            let mut posts = Vec::new();
            for_each_entry(&store, &filter, |e| {
                posts.push(e.entry.clone());
                Ok::<(), StoreError>(())
            })
            .await
            .map_err(|e| InventoryError::Ledger(e.to_string()))?;
            report.holders = holders_of(&posts);
        }
        None => report
            .notes
            .push("holders not read: pass --store URL (the ledger)".into()),
    }
    Ok(report)
}

/// Print the report as a table or JSON.
pub fn write(
    report: &DeviceReport,
    output: InventoryOutput,
    out: &mut impl std::io::Write,
) -> Result<(), InventoryError> {
    if output == InventoryOutput::Json {
        serde_json::to_writer_pretty(&mut *out, report).map_err(std::io::Error::other)?;
        writeln!(out)?;
        return Ok(());
    }
    let time = crate::k8s::time::rfc3339;
    let mut s = String::new();
    let _ = writeln!(s, "DEVICE {}", report.device);
    if let Some(view) = &report.health {
        let d = &view.device;
        let status = if view.status_text.is_empty() {
            format!("{:?}", d.status)
        } else {
            view.status_text.clone()
        };
        let _ = writeln!(s, "NODE   {}", d.node);
        // What the card says of itself, as its exporter reports it.
        let r = &d.reading;
        let fact = |v: &Option<String>| v.as_deref().unwrap_or("-").to_string();
        let _ = writeln!(
            s,
            "CARD   model={} uuid={} driver={} firmware={}",
            fact(&r.model),
            fact(&r.uuid),
            fact(&r.driver_version),
            fact(&r.firmware_version)
        );
        let _ = writeln!(s, "STATUS {status}");
        if !d.reasons.is_empty() {
            let _ = writeln!(s, "WHY    {}", d.reasons.join("; "));
        }
        if let Some(h) = &view.holder {
            let _ = writeln!(
                s,
                "NOW    {}/{} workload={} team={}{}",
                h.namespace,
                h.pod,
                h.workload.as_deref().unwrap_or("-"),
                h.team.as_deref().unwrap_or("-"),
                h.claim
                    .as_deref()
                    .map(|c| format!(" claim={c}"))
                    .unwrap_or_default()
            );
        }
        let _ = writeln!(s);
        let _ = writeln!(s, "{:<22} {:<10} {:<10} REASONS", "CHANGED", "FROM", "TO");
        for Transition {
            at,
            from,
            to,
            reasons,
        } in &d.transitions
        {
            let _ = writeln!(
                s,
                "{:<22} {:<10} {:<10} {}",
                time(*at),
                from.map(|f| format!("{f:?}")).unwrap_or_else(|| "-".into()),
                format!("{to:?}"),
                reasons.join("; ")
            );
        }
    }
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "{:<22} {:<22} {:<12} {:<24} {:<10} CREDITS",
        "FROM", "TO", "TEAM", "WORKLOAD", "ADMISSION"
    );
    for h in &report.holders {
        let _ = writeln!(
            s,
            "{:<22} {:<22} {:<12} {:<24} {:<10} {}",
            time(h.from),
            time(h.to),
            h.team,
            format!("{}/{}", h.namespace, h.workload),
            h.admission,
            format_micros(i128::from(h.credits))
        );
    }
    for note in &report.notes {
        let _ = writeln!(s, "note: {note}");
    }
    out.write_all(s.as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::conformance::lifecycle;

    #[test]
    fn the_text_view_names_the_cards_facts_and_its_claim() {
        let reading = crate::health::exporters::DeviceReading {
            device: "3".into(),
            uuid: Some("GPU-0003".into()),
            model: Some("NVIDIA H100 80GB HBM3".into()),
            driver_version: Some("550.54.15".into()),
            firmware_version: Some("96.00.89.00.01".into()),
            ..Default::default()
        };
        let view: DeviceView = serde_json::from_value(serde_json::json!({
            "node": "gpu-h100-01", "vendor": "nvidia", "device": "3", "status": "Healthy",
            "reasons": [], "observedAt": 1_764_547_200, "lastUnhealthyAt": null, "source": "dcgm",
            "reading": reading,
            "holder": {"namespace": "ml", "pod": "train-0", "workload": "job-train",
                       "team": "vision", "claim": "train-0-gpus"},
        }))
        .expect("a /devices entry");
        let report = DeviceReport {
            device: "GPU-0003".into(),
            health: Some(view),
            ..Default::default()
        };
        let mut out = Vec::new();
        write(&report, InventoryOutput::Table, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("CARD   model=NVIDIA H100 80GB HBM3 uuid=GPU-0003 driver=550.54.15 firmware=96.00.89.00.01"),
            "{text}"
        );
        assert!(
            text.contains("NOW    ml/train-0 workload=job-train team=vision claim=train-0-gpus"),
            "{text}"
        );
    }

    #[test]
    fn posts_fold_into_one_row_per_admission_newest_first() {
        let mut old = lifecycle("b1", "vision", "u1", 2, 3);
        let mut new = lifecycle("b2", "speech", "u2", 1, 2);
        for e in new.iter_mut() {
            e.start += 86_400;
            e.end += 86_400;
        }
        old.append(&mut new);
        let rows = holders_of(&old);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].team, "speech", "newest first");
        let posts: Vec<_> = old
            .iter()
            .filter(|e| e.kind == EntryKind::Post && e.workload_uid == "u1")
            .collect();
        let r = &rows[1];
        assert_eq!(r.from, posts.iter().map(|e| e.start).min().unwrap());
        assert_eq!(r.to, posts.iter().map(|e| e.end).max().unwrap());
        assert_eq!(r.credits, posts.iter().map(|e| e.credits).sum::<i64>());
    }
}
