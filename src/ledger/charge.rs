//! Charging a recorded admission: every admitted second, line by line, term by
//! term (invariant 2). Pure: no I/O, every time passed in (unix seconds).
//!
//! An admission's *lines* are its (flavor, resource) usages, each with the rate
//! it was priced at. Its reservation is made of *terms* of `term_seconds` (the
//! reservation horizon) from the admission time: term 0 is reserved when the
//! credit check admits the Workload, and each next term is reserved (renewed)
//! [`renewal_lead`] before the reserved span runs out, if the budget covers it
//! ([`Charge::decide_renewal`]). Usage is posted per interval and settled at the
//! end with no clip at any horizon: a Workload that runs past what is reserved
//! (its renewal was refused and Kueue has not stopped it yet, or kaccel was down)
//! gets the missing terms reserved as an *overrun* first, so posts never exceed
//! reserves and nothing is ever free.
//!
//! Amounts use THE pricing function ([`cumulative`]) from the admission time, so
//! the terms of a line add up to its cumulative price (the floors telescope), and
//! posts over any split add up to one post.

use std::collections::BTreeMap;

use super::admission::{ReservationLine, describe_lines, format_duration};
use super::entry::{
    Balances, Entry, EntryKind, LineRef, correction_key, format_micros, post_key, reserve_key,
    void_key,
};
use super::lifecycle::{Ended, PREEMPTION_REFUND};
use super::pricing::cumulative;
use crate::api::Credits;

/// Who is charged: the budget, its team and the Workload's admission.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChargeOwner {
    pub budget: String,
    pub team: String,
    pub namespace: String,
    pub workload: String,
    pub workload_uid: String,
    pub admission: u32,
}

/// A recorded admission, as charging sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Charge {
    pub owner: ChargeOwner,
    /// When Kueue reserved quota for the admission: the pricing anchor.
    pub admitted_at: i64,
    /// Length of one reservation term (the horizon), at least 1 s.
    pub term_seconds: u64,
    pub lines: Vec<ReservationLine>,
    /// The devices (UUIDs) its pods hold now, where known: written on its entries.
    pub devices: Vec<String>,
    /// The MultiKueue worker it runs in, once dispatched (empty: this cluster,
    /// or not dispatched yet): written on its entries.
    pub cluster: String,
}

/// Reason of the Correction that refunds usage posted past the end Kueue recorded.
pub const POSTED_PAST_END: &str = "posted-past-end";

/// How long before the reserved span runs out the next term is reserved: a fifth
/// of a term, between 1 s and 5 minutes.
pub fn renewal_lead(term_seconds: u64) -> i64 {
    i64::try_from((term_seconds / 5).clamp(1, 300)).unwrap_or(300)
}

/// What the store holds for a charged admission.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChargeState {
    /// Terms reserved so far (0: not reserved yet).
    pub terms: u32,
    /// The end of the latest Post (the admission time without posts).
    pub posted_until: i64,
    /// Credits charged per (flavor, resource): posts, less what was posted past
    /// the end and refunded.
    pub posted: BTreeMap<(String, String), i64>,
    /// The admission was settled (its lines voided).
    pub voided: bool,
}

/// What a budget decides when a running admission's next term falls due.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Renewal {
    /// Append these Reserve entries; `overdraft` when they take the budget (or
    /// keep it) below zero, as its policy allows.
    Renew {
        entries: Vec<Entry>,
        overdraft: bool,
    },
    /// The budget cannot cover the next term: stop the Workload through Kueue,
    /// telling the user `message`.
    Stop { message: String },
}

/// A budget's rule for renewals it cannot cover.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RenewalRule {
    /// Renew into a recorded overdraft instead of stopping the Workload.
    pub allow_overdraft: bool,
    /// How far below zero `remaining` may go with `allow_overdraft`.
    pub overdraft_limit: Credits,
}

impl Charge {
    fn seconds_to(&self, at: i64) -> u64 {
        u64::try_from(at.saturating_sub(self.admitted_at)).unwrap_or(0)
    }

    fn term(&self) -> i64 {
        i64::try_from(self.term_seconds.max(1)).unwrap_or(i64::MAX)
    }

    /// Start of term `k` (and end of term `k - 1`).
    pub fn term_start(&self, k: u32) -> i64 {
        self.admitted_at
            .saturating_add(self.term().saturating_mul(i64::from(k)))
    }

    /// The number of terms that reserve `[admitted_at, until)`: at least one.
    pub fn terms_covering(&self, until: i64) -> u32 {
        let span = until.saturating_sub(self.admitted_at).max(1);
        let terms = span.div_euclid(self.term()) + i64::from(span.rem_euclid(self.term()) != 0);
        u32::try_from(terms).unwrap_or(u32::MAX)
    }

    /// The term a Reserve entry starting at `start` belongs to.
    pub fn term_of(&self, start: i64) -> u32 {
        u32::try_from(
            start
                .saturating_sub(self.admitted_at)
                .div_euclid(self.term()),
        )
        .unwrap_or(0)
    }

    /// A line's cumulative price of `[admitted_at, at)`, micro-credits.
    fn charged(&self, line: &ReservationLine, at: i64) -> u64 {
        cumulative(line.rate.rate, line.usage.device_units, self.seconds_to(at))
            .map(|c| c.0)
            .unwrap_or(u64::MAX)
    }

    fn line_ref<'a>(&'a self, line: &'a ReservationLine) -> LineRef<'a> {
        LineRef {
            budget: &self.owner.budget,
            workload_uid: &self.owner.workload_uid,
            admission: self.owner.admission,
            flavor: &line.usage.flavor,
            resource: &line.usage.resource,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn entry(
        &self,
        line: &ReservationLine,
        kind: EntryKind,
        key: String,
        start: i64,
        end: i64,
        credits: u64,
        reason: String,
        created_at: i64,
    ) -> Entry {
        Entry {
            key,
            kind,
            budget: self.owner.budget.clone(),
            team: self.owner.team.clone(),
            namespace: self.owner.namespace.clone(),
            workload: self.owner.workload.clone(),
            workload_uid: self.owner.workload_uid.clone(),
            admission: self.owner.admission,
            class: line.rate.class.clone(),
            flavor: line.usage.flavor.clone(),
            resource: line.usage.resource.clone(),
            device_units: line.usage.device_units,
            start,
            end,
            credits: i64::try_from(credits).unwrap_or(i64::MAX),
            rate_card: line.rate.rate_card.clone(),
            reason,
            created_at,
            rate: line.rate.rate.0,
            devices: self.devices.clone(),
            cluster: self.cluster.clone(),
        }
    }

    /// The price of term `k`, all lines, micro-credits.
    pub fn term_price(&self, k: u32) -> u128 {
        let (from, to) = (self.term_start(k), self.term_start(k.saturating_add(1)));
        self.lines
            .iter()
            .map(|l| u128::from(self.charged(l, to) - self.charged(l, from)))
            .sum()
    }

    /// The Reserve entries of terms `from..to`, one per line and term.
    pub fn reserve_terms(&self, from: u32, to: u32, why: &str, created_at: i64) -> Vec<Entry> {
        let mut out = Vec::new();
        for k in from..to {
            let (start, end) = (self.term_start(k), self.term_start(k.saturating_add(1)));
            for l in &self.lines {
                let credits = self.charged(l, end) - self.charged(l, start);
                let reason = format!(
                    "{why} (term {}): {}",
                    u64::from(k) + 1,
                    describe_lines(std::slice::from_ref(l), self.term_seconds)
                );
                let key = reserve_key(&self.line_ref(l), start);
                out.push(self.entry(
                    l,
                    EntryKind::Reserve,
                    key,
                    start,
                    end,
                    credits,
                    reason,
                    created_at,
                ));
            }
        }
        out
    }

    /// The Posts of `[from, to)`, one per line (none when the interval is empty).
    /// `from` below the admission time counts from the admission.
    pub fn posts(&self, from: i64, to: i64, reason: &str) -> Vec<Entry> {
        let from = from.max(self.admitted_at);
        if to <= from {
            return vec![];
        }
        self.lines
            .iter()
            .map(|l| {
                let credits = self.charged(l, to) - self.charged(l, from);
                let key = post_key(&self.line_ref(l), from, to);
                self.entry(
                    l,
                    EntryKind::Post,
                    key,
                    from,
                    to,
                    credits,
                    reason.to_string(),
                    to,
                )
            })
            .collect()
    }

    /// Reserves for the terms between what is reserved (`state.terms`) and
    /// `until`, when usage ran past the reservation: charged as used, whatever
    /// the balance (the devices were held).
    fn overrun(&self, state: &ChargeState, until: i64, created_at: i64) -> Vec<Entry> {
        let needed = self.terms_covering(until);
        if needed <= state.terms {
            return vec![];
        }
        self.reserve_terms(
            state.terms,
            needed,
            "overrun: held quota past its reservation, charged as used",
            created_at,
        )
    }

    /// The next post boundary after `t`: the next multiple of the post interval
    /// or of the term from the admission, whichever comes first (a term is fully
    /// posted when it ends, so a budget's spending follows its reservations).
    fn next_boundary(&self, t: i64, interval: i64) -> i64 {
        let elapsed = t.saturating_sub(self.admitted_at).max(0);
        let next = |step: i64| {
            self.admitted_at
                .saturating_add((elapsed / step).saturating_add(1).saturating_mul(step))
        };
        next(interval).min(next(self.term()))
    }

    /// The periodic posts due at `now`: one per span between consecutive
    /// boundaries (`next_boundary`: multiples of the interval and of the
    /// term from the admission) that ends by `now` and starts at or after
    /// `posted_until` (the boundaries depend only on the admission, so a replay
    /// finds the same keys), preceded by overrun reserves if they run past the
    /// reserved terms. Also returns when the next post falls due.
    pub fn due_posts(
        &self,
        state: &ChargeState,
        now: i64,
        interval_seconds: u64,
    ) -> (Vec<Entry>, i64) {
        let interval = i64::try_from(interval_seconds.max(1)).unwrap_or(i64::MAX);
        let start = state.posted_until.max(self.admitted_at);
        let mut end = self.next_boundary(start, interval);
        let mut posts = Vec::new();
        let mut from = start;
        while end <= now {
            posts.extend(self.posts(from, end, "usage"));
            from = end;
            end = self.next_boundary(end, interval);
        }
        let mut out = if from > start {
            self.overrun(state, from, now)
        } else {
            vec![]
        };
        out.append(&mut posts);
        (out, end)
    }

    /// Settles an admission that ended at `ended.at`: overrun reserves if it ran
    /// past its terms, the Post of `[posted_until, end)` per line (omitted when
    /// empty), and per line the Void of the rest of what its terms reserved
    /// (always, possibly zero, so the line closes).
    ///
    /// A periodic post can run past the end Kueue records: Kueue stamps some
    /// ends (a deactivation at `maximumExecutionTimeSeconds`) before the
    /// Workload shows them, and kaccel may post in between. Posts are immutable,
    /// so the difference is refunded by a Correction per line that says why: the
    /// charge equals the admitted seconds exactly, with the trail kept.
    pub fn settle(&self, state: &ChargeState, ended: &Ended, created_at: i64) -> Vec<Entry> {
        let end = ended.at.max(self.admitted_at);
        let posted_to = end.max(state.posted_until);
        let mut out = self.overrun(state, posted_to, created_at);
        let terms = state.terms.max(self.terms_covering(posted_to));
        out.extend(self.posts(
            state.posted_until,
            end,
            &format!("usage until {}", ended.reason),
        ));
        let reserved_until = self.term_start(terms);
        for l in &self.lines {
            let rest = self.charged(l, reserved_until) - self.charged(l, posted_to);
            let key = void_key(&self.line_ref(l));
            out.push(self.entry(
                l,
                EntryKind::Void,
                key,
                posted_to,
                posted_to,
                rest,
                "release unused reservation".into(),
                posted_to,
            ));
            let over = self.charged(l, posted_to) - self.charged(l, end);
            if over > 0 {
                let key = correction_key(
                    &self.owner.budget,
                    &self.owner.workload_uid,
                    self.owner.admission,
                    end,
                    posted_to,
                    &format!("{POSTED_PAST_END}/{}/{}", l.usage.flavor, l.usage.resource),
                );
                let mut e = self.entry(
                    l,
                    EntryKind::Correction,
                    key,
                    end,
                    posted_to,
                    0,
                    format!(
                        "{POSTED_PAST_END}: usage was posted until {posted_to}, but it ended at {end} ({})",
                        ended.reason
                    ),
                    posted_to,
                );
                e.credits = -i64::try_from(over).unwrap_or(i64::MAX);
                out.push(e);
            }
        }
        out
    }

    /// When the next term must be reserved, with `terms` reserved.
    pub fn renewal_due_at(&self, terms: u32) -> i64 {
        self.term_start(terms) - renewal_lead(self.term_seconds)
    }

    /// Renews (reserves term `terms`) if the budget's remaining credits cover it,
    /// or its rule allows the overdraft; else Stop with the message the user sees.
    pub fn decide_renewal(
        &self,
        terms: u32,
        balances: &Balances,
        rule: RenewalRule,
        now: i64,
    ) -> Renewal {
        let price = i128::try_from(self.term_price(terms)).unwrap_or(i128::MAX);
        let remaining = balances.remaining();
        let after = remaining - price;
        let limit = i128::from(rule.overdraft_limit.0);
        if after >= 0 {
            return Renewal::Renew {
                entries: self.reserve_terms(terms, terms + 1, "renewal", now),
                overdraft: false,
            };
        }
        if rule.allow_overdraft && after >= -limit {
            let why = format!(
                "renewal in overdraft ({} credits after it, limit {})",
                format_micros(after),
                rule.overdraft_limit
            );
            return Renewal::Renew {
                entries: self.reserve_terms(terms, terms + 1, &why, now),
                overdraft: true,
            };
        }
        let o = &self.owner;
        let (limit_note, other_fix) = if rule.allow_overdraft {
            (
                format!(" (overdraft limit {})", rule.overdraft_limit),
                "raise spec.admission.overdraftLimit",
            )
        } else {
            (
                String::new(),
                "allow an overdraft (spec.admission.whenRenewalShort: Overdraft)",
            )
        };
        Renewal::Stop {
            message: format!(
                "budget {} of team {} cannot renew the credit reservation of Workload {}/{}: \
                 the next {} need {} credits ({}) and {} are left{limit_note}, short by {}; \
                 kaccel stopped it through Kueue (spec.active=false). Add credits \
                 (spec.credits.topUps) and set spec.active=true to resume, or {other_fix}",
                o.budget,
                o.team,
                o.namespace,
                o.workload,
                format_duration(self.term_seconds),
                format_micros(price),
                describe_lines(&self.lines, self.term_seconds),
                format_micros(remaining),
                format_micros(if rule.allow_overdraft {
                    -(after + limit)
                } else {
                    -after
                }),
            ),
        }
    }

    /// The refund of what each line was charged (`posted`), as negative
    /// Corrections, when a platform-caused preemption ended the admission.
    pub fn preemption_refunds(
        &self,
        posted: &BTreeMap<(String, String), i64>,
        ended: &Ended,
    ) -> Vec<Entry> {
        if !ended.platform_preempted {
            return vec![];
        }
        let end = ended.at.max(self.admitted_at);
        self.lines
            .iter()
            .filter_map(|l| {
                let charged = *posted.get(&(l.usage.flavor.clone(), l.usage.resource.clone()))?;
                (charged > 0).then(|| {
                    let key = correction_key(
                        &self.owner.budget,
                        &self.owner.workload_uid,
                        self.owner.admission,
                        self.admitted_at,
                        end,
                        &format!(
                            "{PREEMPTION_REFUND}/{}/{}",
                            l.usage.flavor, l.usage.resource
                        ),
                    );
                    let mut e = self.entry(
                        l,
                        EntryKind::Correction,
                        key,
                        self.admitted_at,
                        end,
                        0,
                        format!("{PREEMPTION_REFUND}: {}", ended.reason),
                        end,
                    );
                    e.credits = -charged;
                    e
                })
            })
            .collect()
    }
}

impl ChargeState {
    /// The state of `charge` from its Workload's entries (any budget and
    /// admission: the others are skipped).
    pub fn of<'a>(charge: &Charge, entries: impl IntoIterator<Item = &'a Entry>) -> Self {
        let mut s = ChargeState {
            posted_until: charge.admitted_at,
            ..Default::default()
        };
        for e in entries {
            if e.admission != charge.owner.admission || e.budget != charge.owner.budget {
                continue;
            }
            match e.kind {
                EntryKind::Reserve => {
                    s.terms = s.terms.max(charge.term_of(e.start).saturating_add(1));
                }
                EntryKind::Post => {
                    *s.posted
                        .entry((e.flavor.clone(), e.resource.clone()))
                        .or_default() += e.credits;
                    s.posted_until = s.posted_until.max(e.end);
                }
                EntryKind::Void => s.voided = true,
                // What was posted past the end and refunded is not charged.
                EntryKind::Correction if e.reason.starts_with(POSTED_PAST_END) => {
                    *s.posted
                        .entry((e.flavor.clone(), e.resource.clone()))
                        .or_default() += e.credits;
                }
                _ => {}
            }
        }
        s
    }

    /// Adds what `entries` (just appended) change.
    pub fn apply(&mut self, charge: &Charge, entries: &[Entry]) {
        let mut next = ChargeState::of(charge, entries);
        next.terms = next.terms.max(self.terms);
        next.posted_until = next.posted_until.max(self.posted_until);
        for (k, v) in &self.posted {
            *next.posted.entry(k.clone()).or_default() += v;
        }
        next.voided |= self.voided;
        *self = next;
    }
}

#[cfg(test)]
mod tests;
