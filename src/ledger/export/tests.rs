//! Tests of the exports: shared fixtures (a charged run, its ledger), plain CSV, pricing, decimals.

use std::collections::BTreeMap;

use super::numbers::{decimal, micro_device_hours};
use super::*;
use crate::api::Credits;
use crate::ledger::admission::{FlavorUsage, RateInfo, ReservationLine};
use crate::ledger::charge::{Charge, ChargeOwner, ChargeState, Renewal, RenewalRule};
use crate::ledger::conformance::grant_like;
use crate::ledger::entry::{Balances, Entry, EntryKind, expiry_key, format_micros};
use crate::ledger::lifecycle::Ended;
use crate::ledger::pricing::Rate;

mod focus;

fn post() -> StoredEntry {
    let mut post = StoredEntry {
        id: 7,
        entry: Entry {
            key: String::new(),
            kind: EntryKind::Post,
            budget: "b".into(),
            team: "vision".into(),
            namespace: "ml".into(),
            workload: "train, \"big\"".into(),
            workload_uid: "uid-1".into(),
            admission: 1,
            class: "gpu-large".into(),
            flavor: "nvidia-h100".into(),
            resource: "nvidia.com/gpu".into(),
            device_units: 8,
            start: 1_767_225_600, // 2026-01-01T00:00:00Z
            end: 1_767_229_200,
            credits: 32_000_000,
            rate_card: "rc-1".into(),
            reason: String::new(),
            created_at: 1_767_229_200,
            rate: 4_000_000,
            devices: vec![],
            cluster: String::new(),
        },
    };
    post.entry.key = post.entry.derived_key().unwrap();
    post
}

fn table(csv: &str) -> Vec<BTreeMap<String, Option<String>>> {
    read_csv_table(csv).expect("a header and rows as wide as it")
}

fn parse_csv(csv: &str) -> Vec<Vec<Option<String>>> {
    read_csv(csv)
}

fn dec(s: &str) -> (i128, u32) {
    parse_decimal(s).unwrap_or_else(|| panic!("not a FOCUS number: {s:?}"))
}

fn dec_eq(a: (i128, u32), b: (i128, u32)) -> bool {
    let s = a.1.max(b.1);
    a.0 * 10i128.pow(s - a.1) == b.0 * 10i128.pow(s - b.1)
}

fn dec_mul(a: (i128, u32), b: (i128, u32)) -> (i128, u32) {
    (a.0 * b.0, a.1 + b.1)
}

fn stored(entries: &[Entry]) -> Vec<StoredEntry> {
    entries
        .iter()
        .enumerate()
        .map(|(i, e)| StoredEntry {
            id: i as i64 + 1,
            entry: e.clone(),
        })
        .collect()
}

fn export_all(format: Format, pricing: Pricing, entries: &[StoredEntry]) -> String {
    let mut ex = Exporter::new(Vec::new(), format, pricing, Parties::default()).unwrap();
    for e in entries {
        ex.write(e).unwrap();
    }
    String::from_utf8(ex.finish().unwrap()).unwrap()
}

fn focus_export(pricing: &str, entries: &[StoredEntry]) -> String {
    export_all(
        Format::Focus,
        Pricing::new("EUR", pricing).unwrap(),
        entries,
    )
}

const T0: i64 = 1_767_225_600; // 2026-01-01T00:00:00Z

fn line(flavor: &str, resource: &str, units: u64, rate: u64) -> ReservationLine {
    ReservationLine {
        usage: FlavorUsage {
            flavor: flavor.into(),
            resource: resource.into(),
            device_units: units,
        },
        rate: RateInfo {
            class: "train".into(),
            model: format!("model-{flavor}"),
            rate: Rate(rate),
            rate_card: "rc-7f3a".into(),
        },
        credits: Credits(0),
    }
}

/// One admission of two lines at different, awkward rates charged by the real
/// charging code: reserved, renewed term by term, posted every 61 s and settled
/// after 1799 s by a platform preemption (refunded).
fn charged_run(budget: &str, team: &str, uid: &str) -> Vec<Entry> {
    let c = Charge {
        owner: ChargeOwner {
            budget: budget.into(),
            team: team.into(),
            namespace: format!("ns-{team}"),
            workload: format!("job-{uid}"),
            workload_uid: uid.into(),
            admission: 1,
        },
        admitted_at: T0 + 17,
        term_seconds: 600,
        lines: vec![
            line("nvidia-h100", "nvidia.com/gpu", 2, 3_333_333),
            line("mig-1g", "nvidia.com/mig-1g.10gb", 7, 250_001),
        ],
        devices: vec![],
        cluster: String::new(),
    };
    let rich = Balances {
        granted: 1 << 80,
        ..Default::default()
    };
    let mut all = c.reserve_terms(0, 1, "reserve", c.admitted_at);
    let mut state = ChargeState::of(&c, &all);
    let end = c.admitted_at + 1799;
    for now in (c.admitted_at..end).step_by(45) {
        if now >= c.renewal_due_at(state.terms)
            && let Renewal::Renew { entries, .. } =
                c.decide_renewal(state.terms, &rich, RenewalRule::default(), now)
        {
            state.apply(&c, &entries);
            all.extend(entries);
        }
        let (posts, _) = c.due_posts(&state, now, 61);
        state.apply(&c, &posts);
        all.extend(posts);
    }
    let ended = Ended {
        at: end,
        platform_preempted: true,
        reason: "quota released; evicted: Preempted".into(),
    };
    all.extend(c.settle(&state, &ended, end));
    let state = ChargeState::of(&c, &all);
    all.extend(c.preemption_refunds(&state.posted, &ended));
    for e in &all {
        e.validate().unwrap();
    }
    assert!(all.iter().filter(|e| e.kind == EntryKind::Reserve).count() >= 6);
    all
}

/// A run, its budget's grant, a pre-version-3 Post without a rate, and a
/// refund written in the next month (a correction of an invoiced period).
fn ledger() -> Vec<Entry> {
    let mut all = charged_run("vision-q1", "vision", "u-1");
    all.insert(0, grant_like(&all[0], 5_000_000_000));
    let mut legacy = all
        .iter()
        .find(|e| e.kind == EntryKind::Post && e.flavor == "nvidia-h100")
        .unwrap()
        .clone();
    legacy.workload_uid = "u-legacy".into();
    legacy.rate = 0;
    legacy.key = legacy.derived_key().unwrap();
    all.push(legacy);
    let refund = all
        .iter_mut()
        .find(|e| e.kind == EntryKind::Correction)
        .unwrap();
    refund.created_at = T0 + 40 * 86_400;
    all
}

#[tokio::test]
async fn csv_delta_columns_sum_to_the_store_balances() {
    use crate::ledger::store::{LedgerStore, SqliteStore};
    let mut entries = ledger();
    // A second budget with an expired grant and a run still open (reserved).
    let mut open = charged_run("nlp-q1", "nlp", "u-2");
    open.retain(|e| matches!(e.kind, EntryKind::Reserve | EntryKind::Post));
    let grant = grant_like(&open[0], 900_000_000);
    let expiry = Entry {
        key: expiry_key("nlp-q1", grant.start),
        kind: EntryKind::Expiry,
        credits: 100_000_000,
        ..grant.clone()
    };
    entries.extend([grant, expiry]);
    entries.extend(open);
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("ledger.db"))
        .await
        .unwrap();
    store.append(&entries).await.unwrap();
    let mut out = Vec::new();
    export_entries(
        &store,
        &EntryFilter::default(),
        Format::Csv,
        Pricing::new("EUR", "1").unwrap(),
        Parties::default(),
        &mut out,
    )
    .await
    .unwrap();
    let rows = table(&String::from_utf8(out).unwrap());
    assert_eq!(rows.len(), entries.len());
    for budget in ["vision-q1", "nlp-q1"] {
        let want = store.balances(budget).await.unwrap();
        assert!(want.reserved != 0 || budget == "vision-q1");
        let sum = |col: &str| -> i128 {
            rows.iter()
                .filter(|r| r["budget"].as_deref() == Some(budget))
                .map(|r| {
                    let (v, scale) = dec(r[col].as_deref().unwrap());
                    v * 10i128.pow(6 - scale)
                })
                .sum()
        };
        assert_eq!(sum("grantedDelta"), want.granted, "{budget}");
        assert_eq!(sum("reservedDelta"), want.reserved, "{budget}");
        assert_eq!(sum("spentDelta"), want.spent, "{budget}");
        assert_eq!(sum("remainingDelta"), want.remaining(), "{budget}");
    }
}

#[test]
fn csv_quotes_and_formats() {
    let csv = export_all(Format::Csv, Pricing::new("EUR", "1").unwrap(), &[post()]);
    let line = csv.lines().nth(1).unwrap();
    assert!(line.contains("\"train, \"\"big\"\"\""), "{line}");
    assert!(line.contains("2026-01-01T00:00:00Z"));
    assert!(line.contains(",32,"));
    // 8 device-hours at 4 credits: spent +32, reserved -32; no devices known,
    // this cluster.
    assert!(line.ends_with(",8,4,0,-32,32,0,,"), "{line}");
}

#[test]
fn every_format_names_the_worker_cluster_an_entry_ran_in() {
    let mut dispatched = post();
    dispatched.entry.cluster = "worker-eu-1".into();
    let pricing = || Pricing::new("EUR", "1").unwrap();
    let csv = export_all(Format::Csv, pricing(), std::slice::from_ref(&dispatched));
    assert_eq!(table(&csv)[0]["cluster"].as_deref(), Some("worker-eu-1"));
    let focus = export_all(Format::Focus, pricing(), std::slice::from_ref(&dispatched));
    assert_eq!(
        table(&focus)[0]["x_Cluster"].as_deref(),
        Some("worker-eu-1")
    );
    let json = export_all(Format::Json, pricing(), &[dispatched]);
    let v: serde_json::Value = serde_json::from_str(json.lines().next().unwrap()).unwrap();
    assert_eq!(v["cluster"], "worker-eu-1");
    // This cluster: an empty CSV cell, a NULL FOCUS cell, no JSON key.
    let here = export_all(Format::Focus, pricing(), &[post()]);
    assert_eq!(table(&here)[0]["x_Cluster"], None);
    let json = export_all(Format::Json, pricing(), &[post()]);
    let v: serde_json::Value = serde_json::from_str(json.lines().next().unwrap()).unwrap();
    assert!(v.get("cluster").is_none());
}

#[test]
fn every_format_carries_the_devices_an_entry_held() {
    let mut held = post();
    held.entry.devices = vec!["GPU-5f3a8c2e".into(), "GPU-9c41d7b0".into()];
    let pricing = || Pricing::new("EUR", "1").unwrap();
    let csv = export_all(Format::Csv, pricing(), std::slice::from_ref(&held));
    let rows = table(&csv);
    assert_eq!(
        rows[0]["devices"].as_deref(),
        Some("GPU-5f3a8c2e GPU-9c41d7b0")
    );
    let focus = export_all(Format::Focus, pricing(), std::slice::from_ref(&held));
    let rows = table(&focus);
    assert_eq!(
        rows[0]["x_Devices"].as_deref(),
        Some("GPU-5f3a8c2e GPU-9c41d7b0")
    );
    let json = export_all(Format::Json, pricing(), &[held]);
    let v: serde_json::Value = serde_json::from_str(json.lines().next().unwrap()).unwrap();
    assert_eq!(
        v["devices"],
        serde_json::json!(["GPU-5f3a8c2e", "GPU-9c41d7b0"])
    );
    // Unknown devices: an empty CSV cell, a NULL FOCUS cell, no JSON key.
    let none = export_all(Format::Focus, pricing(), &[post()]);
    assert_eq!(table(&none)[0]["x_Devices"], None);
}

#[test]
fn rejects_bad_pricing_and_names() {
    assert!(Pricing::new("eur", "1").is_err());
    assert!(Pricing::new("CREDITS", "1").is_err());
    assert!(Pricing::new("EUR", "-1").is_err());
    assert_eq!(Pricing::new("EUR", "0.5").unwrap().micro_price, 500_000);
    let e = Parties::new(" ", None, None).unwrap_err().to_string();
    assert!(e.contains("--provider"), "{e}");
    let e = Parties::new("p", Some("a\nb"), None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("--publisher"), "{e}");
    assert_eq!(Parties::new("p", None, None).unwrap().invoice_issuer, "p");
}

proptest::proptest! {
    /// `decimal` (64-bit fast path or not) reads back as the exact value.
    #[test]
    fn decimals_read_back_exactly(num in (i128::MIN + 1)..=i128::MAX, scale in 0u32..=18) {
        let text = decimal(num, scale);
        let (digits, at) = parse_decimal(&text).unwrap();
        // The same rational: digits / 10^at == num / 10^scale.
        let (a, b) = if at <= scale {
            (digits.checked_mul(10i128.pow(scale - at)), Some(num))
        } else {
            (Some(digits), num.checked_mul(10i128.pow(at - scale)))
        };
        proptest::prop_assert_eq!(a, b, "{} for {} / 10^{}", text, num, scale);
    }
}

#[test]
fn an_interval_no_arithmetic_holds_is_refused_by_name_in_every_format() {
    // Found by tests/fuzz.rs: device-seconds x 10^6 overflowed (a panic in debug
    // builds, a wrapped number in release ones).
    assert_eq!(micro_device_hours(u64::MAX, i64::MIN, i64::MAX), None);
    let mut damaged = post();
    damaged.entry.device_units = 24_754_604_412_037;
    damaged.entry.start = -7_715_881_476_472_624_489;
    damaged.entry.end = 0;
    for format in [Format::Csv, Format::Focus] {
        let pricing = Pricing::new("EUR", "1").unwrap();
        let mut ex = Exporter::new(Vec::new(), format, pricing, Parties::default()).unwrap();
        let message = ex.write(&damaged).unwrap_err().to_string();
        assert!(
            message.starts_with(&format!(
                "ledger entry id {} ({})",
                damaged.id, damaged.entry.key
            )) && message.contains("24754604412037 device(s) from -7715881476472624489 to 0"),
            "{format:?}: {message}"
        );
        assert_eq!(ex.rows(), 0);
    }
}

#[test]
fn decimals_are_exact() {
    assert_eq!(decimal(1, 12), "0.000000000001");
    assert_eq!(decimal(-2_500_000_000_000, 12), "-2.5");
    // 1 device-second = 0.000277(7) device-hours: rounded, not truncated.
    assert_eq!(micro_device_hours(1, 0, 1), Some(278));
    assert_eq!(micro_device_hours(1, 0, 9), Some(2500));
    assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
    assert_eq!(parse_decimal("-0.150"), Some((-150, 3)));
    for bad in ["", "+1", "1.", ".5", "1e5", "1,5", "-"] {
        assert_eq!(parse_decimal(bad), None, "{bad:?}");
    }
}
