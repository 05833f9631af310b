use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use proptest::prelude::*;

use super::*;
use crate::api::parsed::parse_budget;
use crate::api::{AdmissionPolicy, ClassGrant, CreditAllowance, CreditBudgetSpec, Period, TopUp};

const T0: i64 = 1_764_547_200; // 2025-12-01T00:00:00Z

fn spec(per_period: &str, days: u32, top_ups: Vec<TopUp>) -> CreditBudgetSpec {
    CreditBudgetSpec {
        team: "vision".into(),
        namespaces: vec!["vision".into()],
        classes: vec![ClassGrant {
            name: "x".into(),
            guaranteed_devices: 1,
        }],
        credits: CreditAllowance {
            per_period: per_period.into(),
            period: Period {
                start: Time(k8s_openapi::jiff::Timestamp::from_second(T0).unwrap()),
                days,
            },
            top_ups,
        },
        fair_share_weight: None,
        on_exhaustion: ExhaustionPolicy::Hold,
        allow_borrowing: true,
        admission: AdmissionPolicy::default(),
    }
}

/// The budget `spec` describes, as the ledger receives it: parsed.
fn budget(per_period: &str, days: u32, top_ups: Vec<TopUp>) -> ParsedBudget {
    parse_budget(&spec(per_period, days, top_ups)).expect("a valid budget")
}

fn top_up(name: &str, credits: &str) -> TopUp {
    TopUp {
        name: name.into(),
        credits: credits.into(),
        reason: Some("launch".into()),
    }
}

/// An in-memory ledger for one budget.
#[derive(Default)]
struct Ledger {
    entries: BTreeMap<String, Entry>,
    balances: Balances,
}

impl Ledger {
    fn call(&self, budget: &ParsedBudget, now: i64) -> Result<Vec<Entry>, BudgetError> {
        let known = |k: &str| self.entries.get(k).cloned();
        budget_entries("b", budget, now, &known, self.balances)
    }

    fn append(&mut self, entries: &[Entry]) {
        for e in entries {
            e.validate().unwrap();
            assert!(
                self.entries.insert(e.key.clone(), e.clone()).is_none(),
                "{} written twice",
                e.key
            );
            self.balances.apply(e.kind, e.credits);
        }
    }

    fn spend(&mut self, micros: i64) {
        self.balances.apply(EntryKind::Post, micros);
        self.balances.reserved += i128::from(micros);
    }
}

#[test]
fn periods_are_days_long_from_start() {
    let s = budget("1", 30, vec![]);
    assert_eq!(current_period(&s.period, T0 - 1), None);
    let p = current_period(&s.period, T0).unwrap();
    assert_eq!((p.index, p.start, p.end), (0, T0, T0 + 30 * DAY));
    let p = current_period(&s.period, T0 + 30 * DAY).unwrap();
    assert_eq!((p.index, p.start), (1, T0 + 30 * DAY));
    let p = current_period(&s.period, T0 + 61 * DAY - 1).unwrap();
    assert_eq!(p.index, 2);
    let zero_days = ParsedPeriod { start: T0, days: 0 };
    assert_eq!(current_period(&zero_days, T0), None);
}

#[test]
fn first_call_grants_period_and_top_ups_then_nothing() {
    let s = budget("100", 30, vec![top_up("q3-extra", "50.5")]);
    let mut l = Ledger::default();
    assert!(l.call(&s, T0 - 10).unwrap().is_empty());
    let out = l.call(&s, T0 + 10).unwrap();
    let keys: Vec<&str> = out.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(keys, [format!("grant/b/{T0}"), "topup/b/q3-extra".into()]);
    assert_eq!(out[0].credits, 100_000_000);
    assert_eq!(out[0].reason, "period grant");
    assert_eq!(out[1].credits, 50_500_000);
    assert_eq!(out[1].reason, "top-up q3-extra: launch");
    assert!(out.iter().all(|e| e.team == "vision"
        && e.created_at == T0 + 10
        && e.end == T0 + 30 * DAY
        && e.rate_card.is_empty()));
    l.append(&out);
    assert!(l.call(&s, T0 + 20).unwrap().is_empty());
    assert_eq!(l.balances.granted, 150_500_000);
}

#[test]
fn next_period_expires_unused_before_granting() {
    let s = budget("100", 30, vec![top_up("extra", "20")]);
    let mut l = Ledger::default();
    let out = l.call(&s, T0).unwrap();
    l.append(&out);
    l.spend(70_000_000);
    l.balances.reserved += 10_000_000; // running work keeps its reservation
    let out = l.call(&s, T0 + 30 * DAY).unwrap();
    assert_eq!(out.len(), 2, "{out:?}");
    assert_eq!(out[0].kind, EntryKind::Expiry);
    assert_eq!(out[0].key, format!("expiry/b/{T0}"));
    assert_eq!((out[0].start, out[0].end), (T0, T0 + 30 * DAY));
    assert_eq!(out[0].credits, 40_000_000); // 120 - 70 spent - 10 reserved
    assert_eq!(out[1].key, format!("grant/b/{}", T0 + 30 * DAY));
    l.append(&out);
    assert_eq!(l.balances.remaining(), 100_000_000);
    assert!(l.call(&s, T0 + 31 * DAY).unwrap().is_empty());
}

#[test]
fn overrun_expires_nothing_and_is_paid_from_the_next_grant() {
    let s = budget("100", 1, vec![]);
    let mut l = Ledger::default();
    let out = l.call(&s, T0).unwrap();
    l.append(&out);
    l.spend(130_000_000);
    let out = l.call(&s, T0 + DAY).unwrap();
    assert_eq!(out[0].kind, EntryKind::Expiry);
    assert_eq!(out[0].credits, 0);
    l.append(&out);
    assert_eq!(l.balances.remaining(), 70_000_000);
}

#[test]
fn grant_written_without_its_expiry_is_not_expired_again() {
    let s = budget("100", 1, vec![]);
    let mut l = Ledger::default();
    let out = l.call(&s, T0).unwrap();
    l.append(&out);
    l.spend(40_000_000);
    let out = l.call(&s, T0 + DAY).unwrap();
    // Only the grant made it into the store.
    l.append(&out[1..]);
    let out = l.call(&s, T0 + DAY + 5).unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].kind, EntryKind::Expiry);
    assert_eq!(out[0].credits, 60_000_000);
}

#[test]
fn skipped_periods_expire_the_last_granted_one() {
    let s = budget("10", 1, vec![]);
    let mut l = Ledger::default();
    let out = l.call(&s, T0).unwrap();
    l.append(&out);
    let out = l.call(&s, T0 + 5 * DAY).unwrap();
    assert_eq!(out[0].key, format!("expiry/b/{T0}"));
    assert_eq!(out[0].credits, 10_000_000);
    assert_eq!(out[1].key, format!("grant/b/{}", T0 + 5 * DAY));
}

#[test]
fn zero_per_period_grants_only_top_ups_and_still_expires_them() {
    let s = budget("0", 1, vec![top_up("once", "5")]);
    let mut l = Ledger::default();
    let out = l.call(&s, T0).unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].key, "topup/b/once");
    l.append(&out);
    let out = l.call(&s, T0 + DAY).unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].kind, EntryKind::Expiry);
    assert_eq!(out[0].credits, 5_000_000);
}

#[test]
fn changed_top_up_is_refused_with_the_fix() {
    let mut l = Ledger::default();
    let out = l
        .call(&budget("1", 30, vec![top_up("extra", "200")]), T0)
        .unwrap();
    l.append(&out);
    let e = l
        .call(&budget("1", 30, vec![top_up("extra", "250")]), T0 + 1)
        .unwrap_err();
    assert_eq!(
        e,
        BudgetError::TopUpChanged {
            name: "extra".into(),
            stored: "200".into(),
            now: "250".into()
        }
    );
    let msg = e.to_string();
    assert!(
        msg.contains("immutable") && msg.contains("another name"),
        "{msg}"
    );
}

#[test]
fn exhaustion_by_policy() {
    let b = |granted, reserved, spent| Balances {
        granted,
        reserved,
        spent,
    };
    assert!(!is_exhausted(ExhaustionPolicy::Hold, &b(0, 0, 0)));
    assert!(!is_exhausted(ExhaustionPolicy::HoldAndDrain, &b(0, 0, 0)));
    assert!(!is_exhausted(ExhaustionPolicy::Hold, &b(100, 50, 49)));
    assert!(is_exhausted(ExhaustionPolicy::Hold, &b(100, 50, 50)));
    // Reservations alone never drain.
    assert!(!is_exhausted(
        ExhaustionPolicy::HoldAndDrain,
        &b(100, 90, 50)
    ));
    assert!(is_exhausted(
        ExhaustionPolicy::HoldAndDrain,
        &b(100, 0, 100)
    ));
    assert!(is_exhausted(
        ExhaustionPolicy::HoldAndDrain,
        &b(100, 0, 120)
    ));
}

#[test]
fn burn_and_projection() {
    assert_eq!(burn_rate_per_hour(48_000_000), 2_000_000);
    assert_eq!(burn_rate_per_hour(0), 0);
    assert_eq!(projected_exhaustion(100, 10, 0), None);
    assert_eq!(projected_exhaustion(100, 10, -5), None);
    assert_eq!(projected_exhaustion(100, 0, 0), Some(100));
    assert_eq!(projected_exhaustion(100, -3, 7), Some(100));
    // 4 credits at 2 per hour: two hours.
    assert_eq!(
        projected_exhaustion(100, 4_000_000, 2_000_000),
        Some(100 + 7200)
    );
    // Rounded up to the next second.
    assert_eq!(projected_exhaustion(0, 1, 3_600_000_000), Some(1));
    assert_eq!(projected_exhaustion(0, i128::MAX, 1), None);
}

#[derive(Debug, Clone)]
struct Step {
    advance: i64,
    spend: i64,
    top_up: Option<i64>,
}

fn step() -> impl Strategy<Value = Step> {
    (
        0i64..3 * DAY,
        0i64..150_000_000,
        proptest::option::weighted(0.2, 1i64..50_000_000),
    )
        .prop_map(|(advance, spend, top_up)| Step {
            advance,
            spend,
            top_up,
        })
}

proptest! {
    #[test]
    fn entries_are_idempotent_and_bounded(
        days in 1u32..3,
        per_period in 0i64..200_000_000,
        start_offset in -DAY..DAY,
        steps in proptest::collection::vec(step(), 1..40),
    ) {
        let per = format_micros(i128::from(per_period));
        let mut top_ups = Vec::new();
        let mut l = Ledger::default();
        let mut now = T0 + start_offset;
        let mut reached = BTreeSet::new();
        let mut seen_keys = BTreeSet::new();
        for (i, st) in steps.iter().enumerate() {
            now += st.advance;
            if let Some(c) = st.top_up {
                top_ups.push(TopUp {
                    name: format!("t{i}"),
                    credits: format_micros(i128::from(c)),
                    reason: None,
                });
            }
            let s = budget(&per, days, top_ups.clone());
            let out = l.call(&s, now).unwrap();
            for e in &out {
                prop_assert!(seen_keys.insert(e.key.clone()), "{} produced twice", e.key);
                prop_assert!(e.validate().is_ok(), "{:?}", e);
            }
            if let Some(first_grant) = out.iter().position(|e| e.kind == EntryKind::Grant) {
                prop_assert!(out[first_grant..].iter().all(|e| e.kind != EntryKind::Expiry));
            }
            l.append(&out);
            prop_assert!(l.call(&s, now).unwrap().is_empty(), "replay wrote more");
            if let Some(p) = current_period(&s.period, now) {
                reached.insert(p.start);
            }
            l.spend(st.spend);
        }
        let grants: BTreeMap<i64, i64> = l
            .entries
            .values()
            .filter(|e| e.key.starts_with("grant/"))
            .map(|e| (e.start, e.credits))
            .collect();
        if per_period > 0 {
            prop_assert_eq!(grants.keys().copied().collect::<BTreeSet<_>>(), reached);
        } else {
            prop_assert!(grants.is_empty());
        }
        for ex in l.entries.values().filter(|e| e.kind == EntryKind::Expiry) {
            let granted_there: i64 = l
                .entries
                .values()
                .filter(|e| e.kind == EntryKind::Grant && e.start == ex.start)
                .map(|e| e.credits)
                .sum();
            prop_assert!(ex.credits >= 0 && ex.credits <= granted_there, "{:?} > {}", ex, granted_there);
        }
    }

    #[test]
    fn projection_is_when_burn_covers_remaining(
        now in 0i64..2_000_000_000,
        remaining in 1i128..1_000_000_000_000,
        burn in 1i128..1_000_000_000,
    ) {
        let t = projected_exhaustion(now, remaining, burn).unwrap();
        let secs = i128::from(t - now);
        prop_assert!(secs * burn >= remaining * 3600);
        prop_assert!((secs - 1) * burn < remaining * 3600);
    }
}

#[test]
fn known_lookup_is_only_by_key() {
    // `known` may be backed by a store; make sure the function only asks for
    // keys it could write.
    let asked = RefCell::new(Vec::new());
    let known = |k: &str| {
        asked.borrow_mut().push(k.to_string());
        None
    };
    let s = budget("1", 1, vec![top_up("a", "1")]);
    budget_entries("b", &s, T0 + 3 * DAY, &known, Balances::default()).unwrap();
    for k in asked.borrow().iter() {
        assert!(
            k.starts_with("grant/b/") || k.starts_with("expiry/b/") || k == "topup/b/a",
            "{k}"
        );
    }
}
