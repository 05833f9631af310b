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
    /// boundaries ([`Self::next_boundary`]: multiples of the interval and of the
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
mod tests {
    use super::*;
    use crate::ledger::admission::{FlavorUsage, RateInfo};
    use crate::ledger::pricing::Rate;
    use proptest::prelude::*;

    fn line(flavor: &str, units: u64, rate: u64) -> ReservationLine {
        ReservationLine {
            usage: FlavorUsage {
                flavor: flavor.into(),
                resource: "nvidia.com/gpu".into(),
                device_units: units,
            },
            rate: RateInfo {
                class: "c".into(),
                model: format!("model-{flavor}"),
                rate: Rate(rate),
                rate_card: "rc-1".into(),
            },
            credits: Credits(0),
        }
    }

    fn charge(term: u64, lines: Vec<ReservationLine>) -> Charge {
        Charge {
            owner: ChargeOwner {
                budget: "vision".into(),
                team: "vision".into(),
                namespace: "ns".into(),
                workload: "w".into(),
                workload_uid: "uid".into(),
                admission: 1,
            },
            admitted_at: 1000,
            term_seconds: term,
            lines,
        }
    }

    fn ended(at: i64) -> Ended {
        Ended {
            at,
            platform_preempted: false,
            reason: "finished".into(),
        }
    }

    fn sum(entries: &[Entry], kind: EntryKind) -> i64 {
        entries
            .iter()
            .filter(|e| e.kind == kind)
            .map(|e| e.credits)
            .sum()
    }

    #[test]
    fn a_run_of_three_and_a_half_terms_is_charged_in_full() {
        // 2 devices at 3600 credits/device-hour (2 credits/s), term 100 s.
        let c = charge(100, vec![line("h100", 2, 3_600_000_000)]);
        let mut state = ChargeState::default();
        let mut all = c.reserve_terms(0, 1, "reserve", 1000);
        state.apply(&c, &all);
        assert_eq!(state.terms, 1);
        for k in 1..4 {
            let due = c.renewal_due_at(state.terms);
            assert_eq!(due, 1000 + 100 * i64::from(k) - 20);
            let Renewal::Renew { entries, overdraft } = c.decide_renewal(
                state.terms,
                &granted(1_000_000),
                RenewalRule::default(),
                due,
            ) else {
                panic!("covered renewal refused")
            };
            assert!(!overdraft);
            state.apply(&c, &entries);
            all.extend(entries);
        }
        let (posts, next) = c.due_posts(&state, 1000 + 350, 60);
        assert_eq!(next, 1000 + 360);
        state.apply(&c, &posts);
        all.extend(posts);
        let settled = c.settle(&state, &ended(1000 + 350), 1350);
        all.extend(settled);
        // 350 s x 2 devices x 1 credit/s = 700 credits, no horizon clip.
        assert_eq!(sum(&all, EntryKind::Post), 700_000_000);
        assert_eq!(sum(&all, EntryKind::Reserve), 800_000_000);
        assert_eq!(sum(&all, EntryKind::Void), 100_000_000);
        for e in &all {
            e.validate().unwrap();
        }
    }

    #[test]
    fn usage_past_the_reservation_is_reserved_as_overrun_and_charged() {
        // One term of 60 s reserved; the Workload ran 10 minutes (renewal refused,
        // or kaccel down): every second is charged.
        let c = charge(60, vec![line("a", 1, 3_600_000_000)]);
        let reserve = c.reserve_terms(0, 1, "reserve", 1000);
        let state = ChargeState::of(&c, &reserve);
        let out = c.settle(&state, &ended(1600), 1700);
        assert_eq!(sum(&out, EntryKind::Post), 600_000_000);
        let overrun: Vec<&Entry> = out
            .iter()
            .filter(|e| e.kind == EntryKind::Reserve)
            .collect();
        assert_eq!(overrun.len(), 9);
        assert!(overrun[0].reason.starts_with("overrun"));
        assert_eq!(sum(&out, EntryKind::Void), 0);
        // Periodic posts past the reservation reserve the overrun first, too.
        let (posts, _) = c.due_posts(&state, 1250, 100);
        assert_eq!(posts[0].kind, EntryKind::Reserve);
        // Boundaries every 100 s and at every 60 s term end: posted to 1240.
        assert_eq!(sum(&posts, EntryKind::Reserve), 180_000_000);
        assert_eq!(sum(&posts, EntryKind::Post), 240_000_000);
        assert_eq!(posts.last().unwrap().end, 1240);
    }

    #[test]
    fn usage_posted_past_the_recorded_end_is_refunded_by_a_correction() {
        // Posted to 1200, then Kueue shows an end at 1150 (stamped earlier than it
        // was written): the charge is 150 s, the 50 s posted past it refunded.
        let c = charge(100, vec![line("a", 1, 3_600_000_000)]);
        let mut state = ChargeState::default();
        let reserve = c.reserve_terms(0, 2, "reserve", 1000);
        state.apply(&c, &reserve);
        let (posts, _) = c.due_posts(&state, 1200, 100);
        state.apply(&c, &posts);
        assert_eq!(state.posted_until, 1200);
        let out = c.settle(&state, &ended(1150), 1210);
        let spent = sum(&posts, EntryKind::Post)
            + sum(&out, EntryKind::Post)
            + sum(&out, EntryKind::Correction);
        assert_eq!(spent, 150_000_000);
        let correction: Vec<&Entry> = out
            .iter()
            .filter(|e| e.kind == EntryKind::Correction)
            .collect();
        assert_eq!(correction.len(), 1);
        assert_eq!((correction[0].start, correction[0].end), (1150, 1200));
        assert!(correction[0].reason.starts_with(POSTED_PAST_END));
        // Reserves still close exactly: posts + void.
        assert_eq!(
            sum(&reserve, EntryKind::Reserve),
            sum(&posts, EntryKind::Post) + sum(&out, EntryKind::Void)
        );
        for e in out.iter().chain(&posts) {
            e.validate().unwrap();
        }
    }

    #[test]
    fn lines_are_entries_of_their_own_with_their_own_rate() {
        let c = charge(
            3600,
            vec![line("a100", 2, 1_500_000), line("mig-1g", 8, 250_000)],
        );
        let reserve = c.reserve_terms(0, 1, "reserve", 1000);
        assert_eq!(reserve.len(), 2);
        assert_eq!(reserve[0].flavor, "a100");
        assert_eq!(reserve[0].credits, 3_000_000);
        assert_eq!(reserve[0].rate, 1_500_000);
        assert_eq!(reserve[1].flavor, "mig-1g");
        assert_eq!(reserve[1].credits, 2_000_000);
        assert_ne!(reserve[0].key, reserve[1].key);
        let state = ChargeState::of(&c, &reserve);
        let out = c.settle(&state, &ended(1000 + 1800), 2800);
        let voids: Vec<i64> = out
            .iter()
            .filter(|e| e.kind == EntryKind::Void)
            .map(|e| e.credits)
            .collect();
        assert_eq!(voids, vec![1_500_000, 1_000_000]);
    }

    fn granted(credits: u64) -> Balances {
        let mut b = Balances::default();
        b.apply(EntryKind::Grant, Credits::whole(credits).0 as i64);
        b
    }

    #[test]
    fn a_renewal_the_budget_cannot_cover_stops_or_overdraws() {
        let c = charge(3600, vec![line("h100", 4, 100_000_000)]);
        // 400 credits a term; 120 left.
        match c.decide_renewal(1, &granted(120), RenewalRule::default(), 5000) {
            Renewal::Stop { message } => {
                assert!(
                    message.contains("budget vision of team vision"),
                    "{message}"
                );
                assert!(message.contains("need 400 credits"), "{message}");
                assert!(message.contains("120 are left"), "{message}");
                assert!(message.contains("short by 280"), "{message}");
                assert!(message.contains("spec.active=false"), "{message}");
                assert!(message.contains("whenRenewalShort: Overdraft"), "{message}");
            }
            r => panic!("{r:?}"),
        }
        let rule = RenewalRule {
            allow_overdraft: true,
            overdraft_limit: Credits::whole(300),
        };
        match c.decide_renewal(1, &granted(120), rule, 5000) {
            Renewal::Renew { entries, overdraft } => {
                assert!(overdraft);
                assert_eq!(entries.len(), 1);
                assert_eq!(entries[0].start, 1000 + 3600);
                assert!(
                    entries[0].reason.contains("overdraft"),
                    "{}",
                    entries[0].reason
                );
            }
            r => panic!("{r:?}"),
        }
        // Past the overdraft limit: stop.
        match c.decide_renewal(1, &granted(50), rule, 5000) {
            Renewal::Stop { message } => {
                assert!(message.contains("overdraft limit 300"), "{message}");
                assert!(message.contains("short by 50"), "{message}");
                assert!(
                    message.contains("raise spec.admission.overdraftLimit"),
                    "{message}"
                );
            }
            r => panic!("{r:?}"),
        }
    }

    #[test]
    fn preemption_refunds_each_line() {
        let c = charge(3600, vec![line("a", 1, 1_000_000), line("b", 1, 2_000_000)]);
        let posted = BTreeMap::from([
            (("a".to_string(), "nvidia.com/gpu".to_string()), 5),
            (("b".to_string(), "nvidia.com/gpu".to_string()), 7),
        ]);
        let mut e = ended(2000);
        assert!(c.preemption_refunds(&posted, &e).is_empty());
        e.platform_preempted = true;
        let r = c.preemption_refunds(&posted, &e);
        assert_eq!(
            r.iter().map(|e| e.credits).collect::<Vec<_>>(),
            vec![-5, -7]
        );
        assert_ne!(r[0].key, r[1].key);
    }

    proptest! {
        /// However the run is cut into posts, renewals and a settlement (posts
        /// written past the end included), each line's charge (posts and their
        /// corrections) equals rate x units x admitted seconds (floored
        /// cumulatively), reserves cover posts + voids exactly, and every entry is
        /// valid.
        #[test]
        fn every_admitted_second_is_charged(
            rates in proptest::collection::vec((0u64..10_000_000_000, 0u64..64), 1..4),
            term in 1u64..5000, ran in 0i64..50_000,
            checks in proptest::collection::vec(0i64..50_000, 0..12),
            interval in 1u64..4000, renew in any::<bool>()) {
            let lines: Vec<ReservationLine> = rates.iter().enumerate()
                .map(|(i, (r, u))| line(&format!("f{i}"), *u, *r)).collect();
            let c = charge(term, lines);
            let end = c.admitted_at + ran;
            let mut all = c.reserve_terms(0, 1, "reserve", c.admitted_at);
            let mut state = ChargeState::of(&c, &all);
            // Some checks come after the end (kaccel posted before it saw the end).
            let mut times: Vec<i64> = checks.into_iter().map(|t| c.admitted_at + t % (ran + 5000)).collect();
            times.sort_unstable();
            for now in times {
                let rich = Balances { granted: i128::MAX / 4, ..Default::default() };
                if renew
                    && now >= c.renewal_due_at(state.terms)
                    && let Renewal::Renew { entries, .. } = c.decide_renewal(state.terms, &rich, RenewalRule::default(), now)
                {
                    state.apply(&c, &entries);
                    all.extend(entries);
                }
                let (posts, _) = c.due_posts(&state, now, interval);
                state.apply(&c, &posts);
                all.extend(posts);
            }
            let settled = c.settle(&state, &ended(end), end);
            all.extend(settled);
            for l in &c.lines {
                let mine = |k: EntryKind| -> i64 { all.iter().filter(|e| e.kind == k && e.flavor == l.usage.flavor).map(|e| e.credits).sum() };
                let expected = cumulative(l.rate.rate, l.usage.device_units, u64::try_from(ran).unwrap()).unwrap().0 as i64;
                prop_assert_eq!(mine(EntryKind::Post) + mine(EntryKind::Correction), expected);
                prop_assert!(mine(EntryKind::Correction) <= 0);
                prop_assert_eq!(mine(EntryKind::Reserve), mine(EntryKind::Post) + mine(EntryKind::Void));
            }
            let mut keys: Vec<&str> = all.iter().map(|e| e.key.as_str()).collect();
            keys.sort_unstable();
            let n = keys.len();
            keys.dedup();
            prop_assert_eq!(keys.len(), n, "duplicate keys");
            for e in &all { prop_assert!(e.validate().is_ok(), "{:?}", e.validate()); }
        }
    }
}
