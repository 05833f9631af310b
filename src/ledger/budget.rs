//! A budget's own ledger entries: period grants, one-off top-ups and the expiry of
//! what a period left unused, plus the figures derived from balances (exhaustion,
//! burn rate, projected exhaustion).
//!
//! Everything here is pure: no I/O and no clock. The caller passes `now` (unix
//! seconds), a lookup of entries already written (`known`, by idempotency key) and
//! the budget's current [`Balances`]; [`budget_entries`] answers with the entries to
//! append. Calling it again after appending them returns nothing new, so a
//! reconcile loop can call it on every pass.
//!
//! # Periods
//!
//! Period `i` covers `[start + i·days·86400, start + (i+1)·days·86400)` where
//! `start` is `spec.credits.period.start`. Nothing is granted before the first
//! period starts.
//!
//! # What is written, in order
//!
//! 1. **Expiry** of the most recent earlier period that received credits (its
//!    `grant/…` entry or a top-up credited in it) and has no `expiry/…` entry
//!    yet. The amount is the unused part of that period's credits:
//!
//!    `expiry = clamp(remaining − credited_now, 0, granted_in_that_period)`
//!
//!    where `remaining = granted − reserved − spent` over the whole ledger and
//!    `credited_now` is what the current period has already been credited (its
//!    grant and top-ups, when a previous call wrote them without the expiry).
//!    Reserved credits of running work are not unused: they stay with the
//!    reservation and are posted or voided later. Credits carried from earlier
//!    periods can never expire twice, because each period's expiry is capped by
//!    what that period granted and earlier periods were already expired down to
//!    zero. A negative remaining (overrun) expires nothing: the overrun stays
//!    visible and is paid from the next grant. The expiry is written even when
//!    it is zero, so the period is closed once and for all.
//! 2. **Grant** of the current period (`perPeriod`; nothing when it is 0).
//!    Changing `perPeriod` mid-period takes effect in the next period.
//! 3. **Top-up** grants not written yet, credited in the current period. A
//!    top-up is immutable: once written under its name, a different amount in
//!    the spec is an error ([`BudgetError::TopUpChanged`]).
//!
//! The expiry looks back at most [`EXPIRY_LOOKBACK_PERIODS`] periods for an
//! unexpired one (when kaccel was not running for whole periods); periods that
//! received nothing are skipped. Top-ups removed from the spec after they were
//! credited are not counted in their period's cap, which can only make an expiry
//! smaller, never larger.

use crate::api::{CreditAllowance, CreditBudgetSpec, Credits, ExhaustionPolicy};

use super::entry::{Balances, Entry, EntryKind, expiry_key, format_micros, grant_key, topup_key};

/// Seconds per day.
pub const DAY: i64 = 86_400;

/// How many earlier periods [`budget_entries`] searches for one left unexpired.
pub const EXPIRY_LOOKBACK_PERIODS: u64 = 64;

/// One period of a budget: its number (0 for the period starting at
/// `spec.credits.period.start`) and `[start, end)` in unix seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PeriodWindow {
    pub index: u64,
    pub start: i64,
    pub end: i64,
}

/// What makes a budget's entries impossible to compute; each names the field to
/// fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BudgetError {
    #[error(
        "spec.credits.perPeriod {value:?} is not a credit amount: write a non-negative decimal with at most 6 places, e.g. \"5000\""
    )]
    PerPeriod { value: String },
    #[error("spec.credits.period.days is {days}: write a number of days between 1 and 366")]
    PeriodDays { days: u32 },
    #[error(
        "spec.credits.topUps[].name {name:?} is not a DNS label: use lower-case letters, digits and '-', e.g. q3-extra"
    )]
    TopUpName { name: String },
    #[error("spec.credits.topUps[].name {name:?} is listed twice: give each top-up its own name")]
    DuplicateTopUp { name: String },
    #[error(
        "spec.credits.topUps[{name}].credits {value:?} must be a positive decimal with at most 6 places, e.g. \"200\"; to take credits away, lower perPeriod"
    )]
    TopUpCredits { name: String, value: String },
    #[error(
        "top-up {name:?} was granted {stored} credits but spec.credits.topUps now says {now}: top-ups are immutable once granted; restore {stored} and add a new top-up with another name for the difference"
    )]
    TopUpChanged {
        name: String,
        stored: String,
        now: String,
    },
}

/// The length of one period in seconds, or `None` for zero days.
fn period_seconds(spec: &CreditAllowance) -> Option<i64> {
    (spec.period.days > 0).then(|| i64::from(spec.period.days) * DAY)
}

/// Period number `index` of `spec` (`None` for zero-day periods or a window
/// beyond the representable range).
pub fn period_window(spec: &CreditAllowance, index: u64) -> Option<PeriodWindow> {
    let len = i128::from(period_seconds(spec)?);
    let first = i128::from(spec.period.start.0.as_second());
    let start = first + i128::from(index) * len;
    Some(PeriodWindow {
        index,
        start: i64::try_from(start).ok()?,
        end: i64::try_from(start + len).ok()?,
    })
}

/// The period `now` falls in; `None` before the first period starts (or for a
/// zero-day period, which the CRD refuses).
pub fn current_period(spec: &CreditAllowance, now: i64) -> Option<PeriodWindow> {
    let len = period_seconds(spec)?;
    let first = spec.period.start.0.as_second();
    if now < first {
        return None;
    }
    let index = (i128::from(now) - i128::from(first)) / i128::from(len);
    period_window(spec, u64::try_from(index).ok()?)
}

fn valid_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// Parses a credit amount into signed micro-credits (always fits: at most 12
/// integer digits).
fn micros(value: &str) -> Option<i64> {
    let c: Credits = value.parse().ok()?;
    i64::try_from(c.micros()).ok()
}

struct ParsedTopUp<'a> {
    name: &'a str,
    reason: Option<&'a str>,
    micros: i64,
    stored: Option<Entry>,
}

/// The ledger entries to append for `budget_name` at `now`: the expiry of the
/// last period's unused credits, the current period's grant and any top-ups not
/// written yet, in that order (see the module documentation for the rules).
///
/// `known` looks an entry up by idempotency key; `balances` are the budget's
/// balances over everything already written. Entries returned here are not in
/// `known`; after appending them, the same call returns an empty list.
pub fn budget_entries(
    budget_name: &str,
    spec: &CreditBudgetSpec,
    now: i64,
    known: &dyn Fn(&str) -> Option<Entry>,
    balances: Balances,
) -> Result<Vec<Entry>, BudgetError> {
    let allowance = &spec.credits;
    if !(1..=366).contains(&allowance.period.days) {
        return Err(BudgetError::PeriodDays {
            days: allowance.period.days,
        });
    }
    let per_period = micros(&allowance.per_period).ok_or_else(|| BudgetError::PerPeriod {
        value: allowance.per_period.clone(),
    })?;
    let mut top_ups: Vec<ParsedTopUp> = Vec::with_capacity(allowance.top_ups.len());
    for t in &allowance.top_ups {
        if !valid_dns_label(&t.name) {
            return Err(BudgetError::TopUpName {
                name: t.name.clone(),
            });
        }
        if top_ups.iter().any(|p| p.name == t.name) {
            return Err(BudgetError::DuplicateTopUp {
                name: t.name.clone(),
            });
        }
        let m = micros(&t.credits)
            .filter(|m| *m > 0)
            .ok_or_else(|| BudgetError::TopUpCredits {
                name: t.name.clone(),
                value: t.credits.clone(),
            })?;
        let stored = known(&topup_key(budget_name, &t.name));
        if let Some(e) = &stored
            && (e.kind != EntryKind::Grant || e.credits != m)
        {
            return Err(BudgetError::TopUpChanged {
                name: t.name.clone(),
                stored: format_micros(i128::from(e.credits)),
                now: format_micros(i128::from(m)),
            });
        }
        top_ups.push(ParsedTopUp {
            name: &t.name,
            reason: t.reason.as_deref().filter(|r| !r.is_empty()),
            micros: m,
            stored,
        });
    }
    let Some(current) = current_period(allowance, now) else {
        return Ok(Vec::new());
    };

    let entry = |key: String, kind: EntryKind, window: PeriodWindow, credits: i64, reason| Entry {
        key,
        kind,
        budget: budget_name.to_string(),
        team: spec.team.clone(),
        namespace: String::new(),
        workload: String::new(),
        workload_uid: String::new(),
        admission: 0,
        class: String::new(),
        flavor: String::new(),
        resource: String::new(),
        device_units: 0,
        start: window.start,
        end: window.end,
        credits,
        rate_card: String::new(),
        reason,
        created_at: now,
        rate: 0,
    };
    // Top-ups already credited in the period starting at `start`.
    let top_ups_in = |start: i64| -> i128 {
        top_ups
            .iter()
            .filter_map(|t| t.stored.as_ref())
            .filter(|e| e.start == start)
            .map(|e| i128::from(e.credits))
            .sum()
    };
    let current_grant = known(&grant_key(budget_name, current.start));
    let mut out = Vec::new();

    // 1. Expiry of the last earlier period that received credits.
    let credited_now =
        current_grant.as_ref().map_or(0, |e| i128::from(e.credits)) + top_ups_in(current.start);
    for back in 1..=current.index.min(EXPIRY_LOOKBACK_PERIODS) {
        let Some(window) = period_window(allowance, current.index - back) else {
            break;
        };
        let grant = known(&grant_key(budget_name, window.start));
        let topped = top_ups
            .iter()
            .any(|t| t.stored.as_ref().is_some_and(|e| e.start == window.start));
        if grant.is_none() && !topped {
            continue;
        }
        let key = expiry_key(budget_name, window.start);
        if known(&key).is_none() {
            let granted_there =
                grant.as_ref().map_or(0, |e| i128::from(e.credits)) + top_ups_in(window.start);
            let unused = (balances.remaining() - credited_now).clamp(0, granted_there.max(0));
            // `unused` is at most what one period granted, sums of i64 amounts.
            let credits = i64::try_from(unused).unwrap_or(i64::MAX);
            out.push(entry(
                key,
                EntryKind::Expiry,
                window,
                credits,
                "unused credits of the period expire".to_string(),
            ));
        }
        break;
    }

    // 2. The current period's grant.
    if per_period > 0 && current_grant.is_none() {
        out.push(entry(
            grant_key(budget_name, current.start),
            EntryKind::Grant,
            current,
            per_period,
            "period grant".to_string(),
        ));
    }

    // 3. Top-ups not written yet.
    for t in top_ups.iter().filter(|t| t.stored.is_none()) {
        let reason = match t.reason {
            Some(r) => format!("top-up {}: {r}", t.name),
            None => format!("top-up {}", t.name),
        };
        out.push(entry(
            topup_key(budget_name, t.name),
            EntryKind::Grant,
            current,
            t.micros,
            reason,
        ));
    }
    Ok(out)
}

/// Whether `policy`'s action applies to a budget with these balances. Nothing is
/// exhausted while nothing is granted (`granted <= 0`): a budget whose first
/// period has not started yet, or whose ledger is still empty, is not a reason
/// to stop work. (A budget with `perPeriod: "0"` and no top-ups is therefore
/// never exhausted by this test.)
///
/// - `Hold` (new work waits): exhausted when `remaining = granted − reserved −
///   spent <= 0`. Reservations count, because new work must not be admitted on
///   credits that running work has already reserved.
/// - `HoldAndDrain` (admitted work is evicted): exhausted when `granted − spent
///   <= 0`. Reservations alone never drain running work: a reservation is a
///   ceiling on what a Workload may still cost, not money spent, and evicting
///   the very Workloads that hold it would throw away paid-for progress on a
///   projection. Only credits actually posted (spent) exhaust the budget for
///   draining. (The admission of new work should still use the `Hold` test.)
pub fn is_exhausted(policy: ExhaustionPolicy, balances: &Balances) -> bool {
    if balances.granted <= 0 {
        return false;
    }
    match policy {
        ExhaustionPolicy::Hold => balances.remaining() <= 0,
        ExhaustionPolicy::HoldAndDrain => balances.granted - balances.spent <= 0,
    }
}

/// Micro-credits burned per hour, from what was posted over the last 24 hours
/// (rounded towards zero; negative when corrections refunded more than was
/// posted). Format it with [`format_micros`] for `status.burnRatePerHour`.
pub fn burn_rate_per_hour(posted_last_24h_micros: i128) -> i128 {
    posted_last_24h_micros / 24
}

/// When `remaining_micros` reaches zero burning `burn_per_hour_micros` per hour
/// (unix seconds, rounded up to the next second): `now` when nothing remains,
/// `None` when nothing is burning (or the time is beyond what `i64` holds).
pub fn projected_exhaustion(
    now: i64,
    remaining_micros: i128,
    burn_per_hour_micros: i128,
) -> Option<i64> {
    if remaining_micros <= 0 {
        return Some(now);
    }
    if burn_per_hour_micros <= 0 {
        return None;
    }
    let seconds = remaining_micros
        .checked_mul(3600)?
        .div_ceil_positive(burn_per_hour_micros);
    i64::try_from(i128::from(now).checked_add(seconds)?).ok()
}

/// Ceiling division for a non-negative numerator and a positive divisor.
trait DivCeilPositive {
    fn div_ceil_positive(self, d: Self) -> Self;
}

impl DivCeilPositive for i128 {
    fn div_ceil_positive(self, d: i128) -> i128 {
        self / d + i128::from(self % d != 0)
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::collections::{BTreeMap, BTreeSet};

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use proptest::prelude::*;

    use super::*;
    use crate::api::{AdmissionPolicy, ClassGrant, Period, TopUp};

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
        fn call(&self, spec: &CreditBudgetSpec, now: i64) -> Result<Vec<Entry>, BudgetError> {
            let known = |k: &str| self.entries.get(k).cloned();
            budget_entries("b", spec, now, &known, self.balances)
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
        let s = spec("1", 30, vec![]);
        assert_eq!(current_period(&s.credits, T0 - 1), None);
        let p = current_period(&s.credits, T0).unwrap();
        assert_eq!((p.index, p.start, p.end), (0, T0, T0 + 30 * DAY));
        let p = current_period(&s.credits, T0 + 30 * DAY).unwrap();
        assert_eq!((p.index, p.start), (1, T0 + 30 * DAY));
        let p = current_period(&s.credits, T0 + 61 * DAY - 1).unwrap();
        assert_eq!(p.index, 2);
        assert_eq!(current_period(&spec("1", 0, vec![]).credits, T0), None);
    }

    #[test]
    fn first_call_grants_period_and_top_ups_then_nothing() {
        let s = spec("100", 30, vec![top_up("q3-extra", "50.5")]);
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
        let s = spec("100", 30, vec![top_up("extra", "20")]);
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
        let s = spec("100", 1, vec![]);
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
        let s = spec("100", 1, vec![]);
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
        let s = spec("10", 1, vec![]);
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
        let s = spec("0", 1, vec![top_up("once", "5")]);
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
            .call(&spec("1", 30, vec![top_up("extra", "200")]), T0)
            .unwrap();
        l.append(&out);
        let e = l
            .call(&spec("1", 30, vec![top_up("extra", "250")]), T0 + 1)
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
    fn bad_fields_are_named() {
        let l = Ledger::default();
        let e = l.call(&spec("lots", 30, vec![]), T0).unwrap_err();
        assert!(e.to_string().contains("spec.credits.perPeriod"), "{e}");
        for bad in ["-50", "0", "0.0000001", "x"] {
            let e = l
                .call(&spec("1", 30, vec![top_up("a", bad)]), T0)
                .unwrap_err();
            assert!(matches!(e, BudgetError::TopUpCredits { .. }), "{bad}: {e}");
            assert!(e.to_string().contains("spec.credits.topUps"), "{e}");
        }
        let e = l
            .call(&spec("1", 30, vec![top_up("A/b", "1")]), T0)
            .unwrap_err();
        assert!(matches!(e, BudgetError::TopUpName { .. }), "{e}");
        let e = l
            .call(&spec("1", 30, vec![top_up("a", "1"), top_up("a", "2")]), T0)
            .unwrap_err();
        assert!(matches!(e, BudgetError::DuplicateTopUp { .. }), "{e}");
        let e = l.call(&spec("1", 0, vec![]), T0).unwrap_err();
        assert!(e.to_string().contains("spec.credits.period.days"), "{e}");
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
                let s = spec(&per, days, top_ups.clone());
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
                if let Some(p) = current_period(&s.credits, now) {
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
        let s = spec("1", 1, vec![top_up("a", "1")]);
        budget_entries("b", &s, T0 + 3 * DAY, &known, Balances::default()).unwrap();
        for k in asked.borrow().iter() {
            assert!(
                k.starts_with("grant/b/") || k.starts_with("expiry/b/") || k == "topup/b/a",
                "{k}"
            );
        }
    }
}
