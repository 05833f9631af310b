//! Append-only ledger entries and the balances they add up to.
//!
//! Amounts are micro-credits. Every kind carries a non-negative amount except
//! `Correction`, which is signed: positive charges more, negative refunds.
//!
//! | kind       | effect                                                    |
//! |------------|-----------------------------------------------------------|
//! | Grant      | granted += credits (period grant or named top-up)         |
//! | Expiry     | granted -= credits (unused grant at period end)           |
//! | Reserve    | reserved += credits (one per workload admission)          |
//! | Post       | reserved -= credits, spent += credits (usage of an interval) |
//! | Void       | reserved -= credits (release the rest of a reservation)   |
//! | Correction | spent += credits (signed)                                 |
//!
//! `remaining = granted - reserved - spent`.
//!
//! Two-phase semantics (as in TigerBeetle pending transfers): an admission's
//! reservation is posted, possibly several times (one post per charge interval),
//! and then voided for the rest; every post and the void carry a deterministic
//! idempotency key, so each happens at most once, and `posts + void <= reserve`.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::pricing::fnv1a64;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum EntryKind {
    Grant,
    Reserve,
    Post,
    Void,
    Correction,
    Expiry,
}

impl EntryKind {
    pub const ALL: [EntryKind; 6] = [
        EntryKind::Grant,
        EntryKind::Reserve,
        EntryKind::Post,
        EntryKind::Void,
        EntryKind::Correction,
        EntryKind::Expiry,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EntryKind::Grant => "Grant",
            EntryKind::Reserve => "Reserve",
            EntryKind::Post => "Post",
            EntryKind::Void => "Void",
            EntryKind::Correction => "Correction",
            EntryKind::Expiry => "Expiry",
        }
    }
}

impl fmt::Display for EntryKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for EntryKind {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        EntryKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or(())
    }
}

/// One immutable ledger entry. Times are unix seconds (UTC); exports print them as
/// RFC 3339.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    pub key: String,
    pub kind: EntryKind,
    pub budget: String,
    pub team: String,
    pub namespace: String,
    pub workload: String,
    pub workload_uid: String,
    /// Kueue admission number of the workload (1 for the first admission; a
    /// re-admission after eviction gets the next number).
    pub admission: u32,
    pub class: String,
    pub flavor: String,
    pub resource: String,
    pub device_units: u64,
    pub start: i64,
    pub end: i64,
    /// Micro-credits; negative only for `Correction`.
    pub credits: i64,
    pub rate_card: String,
    pub reason: String,
    pub created_at: i64,
}

impl Entry {
    /// The content that must match when an idempotency key is replayed: all
    /// fields except `created_at` (a replay after a crash is written later).
    pub fn same_content(&self, other: &Entry) -> bool {
        let mut a = self.clone();
        a.created_at = other.created_at;
        &a == other
    }

    /// The reservation an entry belongs to (`Reserve`, `Post`, `Void`), as the
    /// reservation's key.
    pub fn reservation(&self) -> Option<String> {
        matches!(
            self.kind,
            EntryKind::Reserve | EntryKind::Post | EntryKind::Void
        )
        .then(|| reserve_key(&self.budget, &self.workload_uid, self.admission))
    }

    /// Checks what a store must refuse: empty key or budget, negative amounts
    /// outside `Correction`, a backwards interval, a key that does not match the
    /// derivation for kinds whose key is fully determined by the entry.
    pub fn validate(&self) -> Result<(), String> {
        if self.key.is_empty() || self.budget.is_empty() {
            return Err("key and budget must not be empty".into());
        }
        if self.credits < 0 && self.kind != EntryKind::Correction {
            return Err(format!(
                "{} entries carry a non-negative amount, got {} micro-credits",
                self.kind, self.credits
            ));
        }
        if self.end < self.start {
            return Err(format!(
                "interval end {} is before start {}",
                self.end, self.start
            ));
        }
        if i64::try_from(self.device_units).is_err() {
            return Err(format!("device units {} too large", self.device_units));
        }
        let expected = match self.kind {
            // A top-up's key names the top-up, not the period it was credited in.
            EntryKind::Grant if self.key.starts_with("topup/") => self
                .key
                .strip_prefix("topup/")
                .and_then(|rest| rest.split_once('/'))
                .filter(|(budget, name)| {
                    *budget == self.budget && !name.is_empty() && !name.contains('/')
                })
                .map(|_| self.key.clone())
                .or_else(|| Some(topup_key(&self.budget, "<name>"))),
            EntryKind::Grant => Some(grant_key(&self.budget, self.start)),
            EntryKind::Expiry => Some(expiry_key(&self.budget, self.start)),
            EntryKind::Reserve => Some(reserve_key(
                &self.budget,
                &self.workload_uid,
                self.admission,
            )),
            EntryKind::Post => Some(post_key(
                &self.budget,
                &self.workload_uid,
                self.admission,
                self.start,
                self.end,
            )),
            EntryKind::Void => Some(void_key(&self.budget, &self.workload_uid, self.admission)),
            EntryKind::Correction => None,
        };
        if let Some(expected) = expected
            && expected != self.key
        {
            return Err(format!(
                "idempotency key {:?} does not match the derived key {expected:?}",
                self.key
            ));
        }
        Ok(())
    }
}

// Idempotency keys. Budget names and UIDs are Kubernetes names (no '/'), so '/'
// separates the parts unambiguously. Keys are human-readable on purpose.

/// A budget's grant for the period starting at `period_start` (unix seconds).
pub fn grant_key(budget: &str, period_start: i64) -> String {
    format!("grant/{budget}/{period_start}")
}

/// Expiry of the unused grant of the period starting at `period_start`.
pub fn expiry_key(budget: &str, period_start: i64) -> String {
    format!("expiry/{budget}/{period_start}")
}

/// A one-off top-up grant named `name` (`spec.credits.topUps[].name`), written
/// once, in the period current when it is first seen.
pub fn topup_key(budget: &str, name: &str) -> String {
    format!("topup/{budget}/{name}")
}

/// The one reservation of a workload admission.
pub fn reserve_key(budget: &str, uid: &str, admission: u32) -> String {
    format!("reserve/{budget}/{uid}/{admission}")
}

/// Usage posted for `[start, end)` of an admission.
pub fn post_key(budget: &str, uid: &str, admission: u32, start: i64, end: i64) -> String {
    format!("post/{budget}/{uid}/{admission}/{start}-{end}")
}

/// The void of the rest of an admission's reservation (at most one).
pub fn void_key(budget: &str, uid: &str, admission: u32) -> String {
    format!("void/{budget}/{uid}/{admission}")
}

/// A correction of an admission's interval for a reason (e.g. "preemption-refund"
/// or a reconciliation finding); the reason is hashed so any text is safe.
pub fn correction_key(
    budget: &str,
    uid: &str,
    admission: u32,
    start: i64,
    end: i64,
    reason: &str,
) -> String {
    format!(
        "correction/{budget}/{uid}/{admission}/{start}-{end}/{:016x}",
        fnv1a64(reason.as_bytes())
    )
}

/// Balances of one budget, in micro-credits (signed: corrections and overruns can
/// push `remaining` below zero, which must be visible, not clamped).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Balances {
    pub granted: i128,
    pub reserved: i128,
    pub spent: i128,
}

impl Balances {
    pub fn remaining(&self) -> i128 {
        self.granted - self.reserved - self.spent
    }

    /// Adds one entry's effect (see the module table).
    pub fn apply(&mut self, kind: EntryKind, credits: i64) {
        let c = i128::from(credits);
        match kind {
            EntryKind::Grant => self.granted += c,
            EntryKind::Expiry => self.granted -= c,
            EntryKind::Reserve => self.reserved += c,
            EntryKind::Post => {
                self.reserved -= c;
                self.spent += c;
            }
            EntryKind::Void => self.reserved -= c,
            EntryKind::Correction => self.spent += c,
        }
    }

    /// Balances from per-kind sums (what a store computes with one GROUP BY).
    pub fn from_sums(sums: &BTreeMap<EntryKind, i128>) -> Self {
        let s = |k| sums.get(&k).copied().unwrap_or(0);
        Balances {
            granted: s(EntryKind::Grant) - s(EntryKind::Expiry),
            reserved: s(EntryKind::Reserve) - s(EntryKind::Post) - s(EntryKind::Void),
            spent: s(EntryKind::Post) + s(EntryKind::Correction),
        }
    }
}

/// A reservation's running totals, for verification.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReservationTotals {
    pub reserved: i128,
    pub posted: i128,
    pub voided: i128,
    pub reserves: u32,
    pub voids: u32,
    /// The ledger row id of the first entry seen (for reports).
    pub first_id: i64,
}

impl ReservationTotals {
    pub fn open(&self) -> i128 {
        self.reserved - self.posted - self.voided
    }
}

/// Formats micro-credits as a decimal credit amount (signed).
pub fn format_micros(micros: i128) -> String {
    let sign = if micros < 0 { "-" } else { "" };
    let m = micros.unsigned_abs();
    let (int, frac) = (m / 1_000_000, m % 1_000_000);
    if frac == 0 {
        format!("{sign}{int}")
    } else {
        let d = format!("{frac:06}");
        format!("{sign}{int}.{}", d.trim_end_matches('0'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn entry(kind: EntryKind, credits: i64, start: i64, end: i64) -> Entry {
        let key = match kind {
            EntryKind::Grant => grant_key("b", start),
            EntryKind::Expiry => expiry_key("b", start),
            EntryKind::Reserve => reserve_key("b", "u", 1),
            EntryKind::Post => post_key("b", "u", 1, start, end),
            EntryKind::Void => void_key("b", "u", 1),
            EntryKind::Correction => correction_key("b", "u", 1, start, end, "r"),
        };
        Entry {
            key,
            kind,
            budget: "b".into(),
            team: "t".into(),
            namespace: "ns".into(),
            workload: "w".into(),
            workload_uid: "u".into(),
            admission: 1,
            class: "c".into(),
            flavor: "f".into(),
            resource: "nvidia.com/gpu".into(),
            device_units: 1,
            start,
            end,
            credits,
            rate_card: "rc-0".into(),
            reason: String::new(),
            created_at: 0,
        }
    }

    #[test]
    fn two_phase_balances() {
        let mut b = Balances::default();
        for (k, c) in [
            (EntryKind::Grant, 1000),
            (EntryKind::Reserve, 400),
            (EntryKind::Post, 100),
            (EntryKind::Post, 150),
            (EntryKind::Void, 150),
            (EntryKind::Correction, -50),
        ] {
            b.apply(k, c);
        }
        assert_eq!(b.granted, 1000);
        assert_eq!(b.reserved, 0);
        assert_eq!(b.spent, 200);
        assert_eq!(b.remaining(), 800);
    }

    #[test]
    fn validate_refuses_bad_entries() {
        assert!(entry(EntryKind::Post, 5, 0, 10).validate().is_ok());
        assert!(entry(EntryKind::Post, -5, 0, 10).validate().is_err());
        assert!(entry(EntryKind::Correction, -5, 0, 10).validate().is_ok());
        assert!(entry(EntryKind::Post, 5, 10, 0).validate().is_err());
        let mut e = entry(EntryKind::Post, 5, 0, 10);
        e.key = "post/b/u/1/0-11".into();
        assert!(e.validate().unwrap_err().contains("derived key"));
        let mut t = entry(EntryKind::Grant, 5, 0, 10);
        t.key = topup_key("b", "q3-extra");
        assert!(t.validate().is_ok());
        for bad in ["topup/other/q3", "topup/b/", "topup/b/x/y"] {
            t.key = bad.into();
            assert!(t.validate().unwrap_err().contains("derived key"), "{bad}");
        }
    }

    #[test]
    fn replay_ignores_created_at() {
        let a = entry(EntryKind::Post, 5, 0, 10);
        let mut b = a.clone();
        b.created_at = 99;
        assert!(a.same_content(&b));
        b.credits = 6;
        assert!(!a.same_content(&b));
    }

    #[test]
    fn formats_micros() {
        assert_eq!(format_micros(2_500_000), "2.5");
        assert_eq!(format_micros(-1), "-0.000001");
        assert_eq!(format_micros(0), "0");
    }

    proptest! {
        /// Folding entries one by one equals computing from per-kind sums.
        #[test]
        fn fold_equals_sums(ops in proptest::collection::vec((0usize..6, -1_000_000i64..1_000_000), 0..64)) {
            let mut folded = Balances::default();
            let mut sums = BTreeMap::new();
            for (k, c) in ops {
                let kind = EntryKind::ALL[k];
                let c = if kind == EntryKind::Correction { c } else { c.abs() };
                folded.apply(kind, c);
                *sums.entry(kind).or_insert(0i128) += i128::from(c);
            }
            prop_assert_eq!(folded, Balances::from_sums(&sums));
            prop_assert_eq!(folded.remaining(), folded.granted - folded.reserved - folded.spent);
        }

        #[test]
        fn kind_round_trips(k in 0usize..6) {
            let kind = EntryKind::ALL[k];
            prop_assert_eq!(kind.as_str().parse::<EntryKind>(), Ok(kind));
        }
    }
}
