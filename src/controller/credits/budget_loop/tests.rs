//! The budget loop's decisions: which findings are drift, and a budget's figures.

use super::*;
use crate::ledger::store::StoredEntry;

fn orphan(key: &str) -> OpenReservation {
    OpenReservation {
        reserve: StoredEntry {
            id: 1,
            entry: Entry {
                key: key.into(),
                kind: EntryKind::Reserve,
                budget: "vision".into(),
                team: "vision".into(),
                namespace: "ns".into(),
                workload: "w1".into(),
                workload_uid: "uid-1".into(),
                admission: 1,
                class: "large-training".into(),
                flavor: "h100".into(),
                resource: "nvidia.com/gpu".into(),
                device_units: 1,
                start: 0,
                end: 100,
                credits: 10,
                rate_card: "rc-1".into(),
                reason: String::new(),
                created_at: 0,
                rate: 0,
                devices: vec![],
                cluster: String::new(),
            },
        },
        reserved: 10,
        reserved_until: 100,
        posted: 0,
        posted_until: 0,
    }
}

fn pass(items: &[(&str, &str, Option<&str>)]) -> Findings {
    let mut findings = Findings::new();
    for (budget, text, orphan_key) in items {
        findings
            .entry(budget.to_string())
            .or_default()
            .push((text.to_string(), orphan_key.map(orphan)));
    }
    findings
}

fn texts(findings: &Findings) -> Vec<(String, String, Option<String>)> {
    findings
        .iter()
        .flat_map(|(budget, list)| {
            list.iter().map(move |(text, orphan)| {
                (
                    budget.clone(),
                    text.clone(),
                    orphan.as_ref().map(|r| r.reserve.entry.key.clone()),
                )
            })
        })
        .collect()
}

#[test]
fn a_finding_is_drift_only_at_its_second_pass_in_a_row() {
    let first = pass(&[
        ("vision", "reservation of w1 is orphaned", Some("w1/1")),
        ("nlp", "cq nlp counts 8 devices, the ledger 0", None),
    ]);
    let (confirmed, seen) = confirmed_findings(&BTreeSet::new(), first.clone());
    assert!(
        confirmed.is_empty(),
        "nothing is drift at its first sighting"
    );
    assert_eq!(seen.len(), 2);

    // Seen again: both confirmed, each under its budget, the orphan kept for closing.
    let (confirmed, seen) = confirmed_findings(&seen, first);
    assert_eq!(
        texts(&confirmed),
        [
            (
                "nlp".to_string(),
                "cq nlp counts 8 devices, the ledger 0".to_string(),
                None
            ),
            (
                "vision".to_string(),
                "reservation of w1 is orphaned".to_string(),
                Some("w1/1".to_string())
            ),
        ]
    );

    // Gone for one pass, then back: a first sighting again.
    let (confirmed, seen) = confirmed_findings(&seen, Findings::new());
    assert!(confirmed.is_empty());
    assert!(seen.is_empty());
    let back = pass(&[("vision", "reservation of w1 is orphaned", Some("w1/1"))]);
    let (confirmed, _) = confirmed_findings(&seen, back);
    assert!(confirmed.is_empty(), "a finding that went away starts over");
}

#[test]
fn only_the_findings_seen_before_are_confirmed_and_empty_budgets_are_dropped() {
    let previous = BTreeSet::from(["old".to_string()]);
    let (confirmed, seen) = confirmed_findings(
        &previous,
        pass(&[
            ("vision", "old", None),
            ("vision", "new", None),
            ("nlp", "also new", None),
        ]),
    );
    assert_eq!(
        texts(&confirmed),
        [("vision".to_string(), "old".to_string(), None)]
    );
    assert_eq!(
        seen,
        BTreeSet::from(["old".into(), "new".into(), "also new".into()])
    );
}

const HOUR: i64 = 3600;

fn balances(granted: i128, reserved: i128, spent: i128) -> Balances {
    Balances {
        granted,
        reserved,
        spent,
    }
}

#[test]
fn the_projection_is_stable_within_an_hour_and_moves_with_the_next() {
    // 240 credits posted over 24 h: 10 per hour; 100 remaining: 10 hours.
    let b = balances(400, 60, 240);
    let at = |now| budget_view(b, 240, now, None, ExhaustionPolicy::Hold, None);
    let start = 1_000 * HOUR;
    let first = at(start + 10);
    assert_eq!(first.burn_per_hour, 10);
    assert_eq!(first.projected_exhaustion, Some(start + 10 * HOUR));
    assert_eq!(
        at(start + HOUR - 1),
        first,
        "no new figures, so no status write, within the hour"
    );
    assert_eq!(
        at(start + HOUR).projected_exhaustion,
        Some(start + 11 * HOUR)
    );
    // Nothing posted: no projection; nothing remaining: exhausted now.
    assert_eq!(
        budget_view(b, 0, start, None, ExhaustionPolicy::Hold, None).projected_exhaustion,
        None
    );
    let spent = balances(400, 0, 400);
    assert_eq!(
        budget_view(spent, 240, start + 5, None, ExhaustionPolicy::Hold, None).projected_exhaustion,
        Some(start)
    );
}

#[test]
fn exhaustion_follows_the_policy_and_the_view_carries_period_and_error() {
    // Everything left is reserved by running work: Hold stops new work, drain does not.
    let b = balances(100, 100, 0);
    let window = PeriodWindow {
        index: 2,
        start: 50,
        end: 150,
    };
    let hold = budget_view(b, 0, 60, Some(window), ExhaustionPolicy::Hold, None);
    assert!(hold.exhausted);
    assert_eq!(hold.period, Some((50, 150)));
    assert!(hold.drift.is_empty());
    let drain = budget_view(
        b,
        0,
        60,
        None,
        ExhaustionPolicy::HoldAndDrain,
        Some("spec.credits.perPeriod: bad".into()),
    );
    assert!(!drain.exhausted);
    assert_eq!(drain.period, None);
    assert_eq!(drain.error.as_deref(), Some("spec.credits.perPeriod: bad"));
}
