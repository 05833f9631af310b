//! A budget's own ledger entries: period grants, one-off top-ups and the expiry of
//! what a period left unused, plus the figures derived from balances (exhaustion,
//! burn rate, projected exhaustion).
//!
//! Everything here is pure: no I/O and no clock. The caller passes `now` (unix
//! seconds), the budget as [`parse_budget`](crate::api::parsed::parse_budget)
//! parsed it (amounts, period and top-ups are validated there, once), a lookup of
//! entries already written (`known`, by idempotency key) and the budget's current
//! [`Balances`]; [`budget_entries`] answers with the entries to append. Calling
//! it again after appending them returns nothing new, so a reconcile loop can
//! call it on every pass. The one error left to it is a top-up whose amount
//! differs from the one already written ([`BudgetError::TopUpChanged`]).
//!
//! # Periods
//!
//! Period `i` covers `[start + i·days·86400, start + (i+1)·days·86400)` where
//! `start` is `spec.credits.period.start` ([`ParsedPeriod::start`]). Nothing is
//! granted before the first period starts.
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

use crate::api::parsed::{ParsedBudget, ParsedPeriod, ParsedTopUp};
use crate::api::{Credits, ExhaustionPolicy};

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

/// What makes a budget's entries impossible to compute. The spec's own fields are
/// checked by [`parse_budget`](crate::api::parsed::parse_budget); what is left
/// depends on the ledger.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BudgetError {
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
fn period_seconds(period: &ParsedPeriod) -> Option<i64> {
    (period.days > 0).then(|| i64::from(period.days) * DAY)
}

/// Period number `index` of `period` (`None` for zero-day periods or a window
/// beyond the representable range).
pub fn period_window(period: &ParsedPeriod, index: u64) -> Option<PeriodWindow> {
    let len = i128::from(period_seconds(period)?);
    let first = i128::from(period.start);
    let start = first + i128::from(index) * len;
    Some(PeriodWindow {
        index,
        start: i64::try_from(start).ok()?,
        end: i64::try_from(start + len).ok()?,
    })
}

/// The period `now` falls in; `None` before the first period starts (or for a
/// zero-day period, which the parser refuses).
pub fn current_period(period: &ParsedPeriod, now: i64) -> Option<PeriodWindow> {
    let len = period_seconds(period)?;
    let first = period.start;
    if now < first {
        return None;
    }
    let index = (i128::from(now) - i128::from(first)) / i128::from(len);
    period_window(period, u64::try_from(index).ok()?)
}

/// A parsed amount in signed micro-credits, as entries carry them. A parsed
/// amount has at most 12 integer digits, so it always fits.
fn signed_micros(credits: Credits) -> i64 {
    i64::try_from(credits.micros()).unwrap_or(i64::MAX)
}

/// A top-up of the spec with what the ledger holds under its name.
struct TopUpState<'a> {
    top_up: &'a ParsedTopUp,
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
    budget: &ParsedBudget,
    now: i64,
    known: &dyn Fn(&str) -> Option<Entry>,
    balances: Balances,
) -> Result<Vec<Entry>, BudgetError> {
    let per_period = signed_micros(budget.per_period);
    let mut top_ups: Vec<TopUpState> = Vec::with_capacity(budget.top_ups.len());
    for t in &budget.top_ups {
        let m = signed_micros(t.credits);
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
        top_ups.push(TopUpState {
            top_up: t,
            micros: m,
            stored,
        });
    }
    let Some(current) = current_period(&budget.period, now) else {
        return Ok(Vec::new());
    };

    let entry = |key: String, kind: EntryKind, window: PeriodWindow, credits: i64, reason| Entry {
        key,
        kind,
        budget: budget_name.to_string(),
        team: budget.team.clone(),
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
        devices: vec![],
        cluster: String::new(),
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
        let Some(window) = period_window(&budget.period, current.index - back) else {
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
        let name = &t.top_up.name;
        let reason = match &t.top_up.reason {
            Some(r) => format!("top-up {name}: {r}"),
            None => format!("top-up {name}"),
        };
        out.push(entry(
            topup_key(budget_name, name),
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
mod tests;
