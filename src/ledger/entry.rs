//! Append-only ledger entries and the balances they add up to.
//!
//! Amounts are micro-credits. Every kind carries a non-negative amount except
//! `Correction`, which is signed: positive charges more, negative refunds.
//!
//! | kind       | effect                                                    |
//! |------------|-----------------------------------------------------------|
//! | Grant      | granted += credits (period grant or named top-up)         |
//! | Expiry     | granted -= credits (unused grant at period end)           |
//! | Reserve    | reserved += credits (one per line and reservation term)   |
//! | Post       | reserved -= credits, spent += credits (usage of an interval) |
//! | Void       | reserved -= credits (release the rest of a reservation)   |
//! | Correction | spent += credits (signed)                                 |
//!
//! `remaining = granted - reserved - spent`.
//!
//! Two-phase semantics (as in TigerBeetle pending transfers), per *line*: one
//! (flavor, resource) of one workload admission ([`LineRef`]). A line is reserved
//! term by term (the first term at admission, each renewal before the previous
//! term runs out), posted once per charge interval, and voided for the rest when
//! the admission ends; every entry carries a deterministic idempotency key, so
//! each happens at most once, and `posts + void <= reserves` per line. Lines of a
//! multi-flavor admission are separate entries, each priced with its own rate.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::k8s::names::fnv1a as fnv1a64;

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
    /// The rate the entry was priced with, in micro-credits per device-hour (from
    /// the rate card named by `rate_card`); 0 for entries no rate prices (grants,
    /// expiries, and lines written before schema version 3).
    #[serde(default)]
    pub rate: u64,
    /// The devices (UUIDs) the admission's pods held when the entry was written,
    /// where exporters attribute them (schema version 4); empty when unknown.
    /// Informational: not part of the entry's identity, so a replay that saw other
    /// devices is the same entry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<String>,
    /// The MultiKueue worker cluster the admission ran in (schema version 6;
    /// Kueue's `status.clusterName`), empty for kaccel's own cluster or before
    /// Kueue dispatched it (a first Reserve is written before: Kueue dispatches
    /// only once the credit check is Ready). Informational like `devices`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cluster: String,
}

/// One line of an admission: the (flavor, resource) of a workload admission that
/// Reserve, Post and Void entries belong to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LineRef<'a> {
    pub budget: &'a str,
    pub workload_uid: &'a str,
    pub admission: u32,
    pub flavor: &'a str,
    pub resource: &'a str,
}

impl Entry {
    /// A blank to read a stored row into (every text empty, every number 0):
    /// not an entry the ledger would accept (its key is empty).
    pub(crate) fn empty() -> Entry {
        Entry {
            key: String::new(),
            kind: EntryKind::Grant,
            budget: String::new(),
            team: String::new(),
            namespace: String::new(),
            workload: String::new(),
            workload_uid: String::new(),
            admission: 0,
            class: String::new(),
            flavor: String::new(),
            resource: String::new(),
            device_units: 0,
            start: 0,
            end: 0,
            credits: 0,
            rate_card: String::new(),
            reason: String::new(),
            created_at: 0,
            rate: 0,
            devices: Vec::new(),
            cluster: String::new(),
        }
    }

    /// The content that must match when an idempotency key is replayed: all
    /// fields except `created_at` (a replay after a crash is written later) and
    /// `devices` (what the replay saw holding the devices).
    pub fn same_content(&self, other: &Entry) -> bool {
        let mut a = self.clone();
        a.created_at = other.created_at;
        a.devices.clone_from(&other.devices);
        a.cluster.clone_from(&other.cluster);
        &a == other
    }

    /// The key derived from the entry's own fields, for the kinds whose key is
    /// fully determined by them (Reserve, Post, Void; Grant and Expiry of a period).
    pub fn derived_key(&self) -> Option<String> {
        match self.kind {
            EntryKind::Reserve => Some(reserve_key(&self.line(), self.start)),
            EntryKind::Post => Some(post_key(&self.line(), self.start, self.end)),
            EntryKind::Void => Some(void_key(&self.line())),
            EntryKind::Grant => Some(grant_key(&self.budget, self.start)),
            EntryKind::Expiry => Some(expiry_key(&self.budget, self.start)),
            EntryKind::Correction => None,
        }
    }

    /// Whether the key is exactly [`derived_key`](Self::derived_key), compared
    /// part by part without building it; false for a kind without one.
    pub fn key_is_derived<'a>(&'a self) -> bool {
        let key = KeyCursor(&self.key);
        let line = |k: KeyCursor<'a>| -> Option<KeyCursor<'a>> {
            k.text(&self.budget)?
                .text("/")?
                .text(&self.workload_uid)?
                .text("/")?
                .int(self.admission.into())?
                .text("/")
        };
        let flavor_and_resource = |k: KeyCursor<'a>| -> Option<KeyCursor<'a>> {
            k.text(&self.flavor)?.text("/")?.text(&self.resource)
        };
        let matched = match self.kind {
            EntryKind::Reserve => key
                .text("reserve/")
                .and_then(line)
                .and_then(|k| k.int(self.start)?.text("/"))
                .and_then(flavor_and_resource),
            EntryKind::Post => key
                .text("post/")
                .and_then(line)
                .and_then(|k| k.int(self.start)?.text("-")?.int(self.end)?.text("/"))
                .and_then(flavor_and_resource),
            EntryKind::Void => key
                .text("void/")
                .and_then(line)
                .and_then(flavor_and_resource),
            EntryKind::Grant => key
                .text("grant/")
                .and_then(|k| k.text(&self.budget)?.text("/")?.int(self.start)),
            EntryKind::Expiry => key
                .text("expiry/")
                .and_then(|k| k.text(&self.budget)?.text("/")?.int(self.start)),
            EntryKind::Correction => None,
        };
        matched.is_some_and(|rest| rest.0.is_empty())
    }

    /// The line of an admission this entry names.
    pub fn line(&self) -> LineRef<'_> {
        LineRef {
            budget: &self.budget,
            workload_uid: &self.workload_uid,
            admission: self.admission,
            flavor: &self.flavor,
            resource: &self.resource,
        }
    }

    /// Writes the reservation line an entry belongs to (`Reserve`, `Post`,
    /// `Void`), as [`line_key`], into `out` (cleared first; a caller reusing
    /// one buffer over millions of entries); false for other kinds.
    pub fn reservation_into(&self, out: &mut String) -> bool {
        out.clear();
        let on_a_line = matches!(
            self.kind,
            EntryKind::Reserve | EntryKind::Post | EntryKind::Void
        );
        if on_a_line {
            push_line_key(out, &self.line());
        }
        on_a_line
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
        if let Some(bad) = self
            .devices
            .iter()
            .find(|d| d.is_empty() || d.contains([',', ';', ' ']))
        {
            return Err(format!(
                "device id {bad:?} must be non-empty, without commas, semicolons or spaces"
            ));
        }
        if !self.cluster.is_empty() && !crate::k8s::names::valid_dns_label(&self.cluster) {
            return Err(format!(
                "cluster {:?} must be a worker's name (a DNS label) or empty",
                self.cluster
            ));
        }
        // Ledgers written before schema version 3 keyed one joined entry per
        // admission; those keys stay valid. (Built only when the key is not
        // the derived one: verify checks millions of entries.)
        let legacy = || match self.kind {
            EntryKind::Reserve => Some(legacy_reserve_key(self)),
            EntryKind::Post => Some(legacy_post_key(self)),
            EntryKind::Void => Some(legacy_void_key(self)),
            _ => None,
        };
        // The common case without building the key: verify checks millions.
        let derived = self.key_is_derived();
        let expected = match self.kind {
            _ if derived => None,
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
            _ => self.derived_key(),
        };
        if let Some(expected) = expected
            && expected != self.key
            && legacy().as_deref() != Some(self.key.as_str())
        {
            return Err(format!(
                "idempotency key {:?} does not match the derived key {expected:?}",
                self.key
            ));
        }
        // Stores keep a key unique per workload UID (schema version 5), which
        // is unique per key only while every key names the UID it is stored
        // under: the derived keys above do; a correction's and a budget-level
        // entry's are checked here.
        if key_workload_uid(&self.key) != self.workload_uid {
            return Err(format!(
                "idempotency key {:?} names workload UID {:?} but the entry is for {:?}",
                self.key,
                key_workload_uid(&self.key),
                self.workload_uid
            ));
        }
        Ok(())
    }
}

/// What is left of a key after the parts matched so far.
#[derive(Clone, Copy)]
struct KeyCursor<'a>(&'a str);

impl<'a> KeyCursor<'a> {
    fn text(self, part: &str) -> Option<KeyCursor<'a>> {
        self.0.strip_prefix(part).map(KeyCursor)
    }

    /// A decimal integer as `format!("{n}")` writes it.
    fn int(self, n: i64) -> Option<KeyCursor<'a>> {
        let mut text = [0u8; 20];
        let digits = super::decimal::u64_digits(n.unsigned_abs(), &mut text);
        let unsigned = if n < 0 { self.text("-")? } else { self };
        unsigned.text(digits)
    }
}

/// The workload UID an idempotency key names: the third part of a reserve,
/// post, void or correction key, none ("") for a budget's grant, expiry or
/// top-up. A store looks a key up under this UID.
pub fn key_workload_uid(key: &str) -> &str {
    let mut parts = key.splitn(4, '/');
    match parts.next() {
        Some("reserve" | "post" | "void" | "correction") => parts.nth(1).unwrap_or_default(),
        _ => "",
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

/// A reservation line: `budget/uid/admission/flavor/resource`. Resource names
/// contain a `/`, so they come last.
pub fn line_key(line: &LineRef<'_>) -> String {
    let mut out = String::new();
    push_line_key(&mut out, line);
    out
}

/// Appends [`line_key`]`(line)` to `out` (a caller reusing one buffer).
pub fn push_line_key(out: &mut String, line: &LineRef<'_>) {
    use std::fmt::Write as _;
    let _ = write!(
        out,
        "{}/{}/{}/{}/{}",
        line.budget, line.workload_uid, line.admission, line.flavor, line.resource
    );
}

/// The reservation of a line for the term starting at `term_start` (unix
/// seconds): the first at admission, one more per renewal.
pub fn reserve_key(line: &LineRef<'_>, term_start: i64) -> String {
    format!(
        "reserve/{}/{}/{}/{term_start}/{}/{}",
        line.budget, line.workload_uid, line.admission, line.flavor, line.resource
    )
}

/// Usage of a line posted for `[start, end)`.
pub fn post_key(line: &LineRef<'_>, start: i64, end: i64) -> String {
    format!(
        "post/{}/{}/{}/{start}-{end}/{}/{}",
        line.budget, line.workload_uid, line.admission, line.flavor, line.resource
    )
}

/// The void of the rest of a line's reservation (at most one, when the
/// admission ends).
pub fn void_key(line: &LineRef<'_>) -> String {
    format!("void/{}", line_key(line))
}

// The keys of schema versions 1 and 2 (one joined entry per admission).
fn legacy_reserve_key(e: &Entry) -> String {
    format!("reserve/{}/{}/{}", e.budget, e.workload_uid, e.admission)
}

fn legacy_post_key(e: &Entry) -> String {
    format!(
        "post/{}/{}/{}/{}-{}",
        e.budget, e.workload_uid, e.admission, e.start, e.end
    )
}

fn legacy_void_key(e: &Entry) -> String {
    format!("void/{}/{}/{}", e.budget, e.workload_uid, e.admission)
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
    let mut out = String::with_capacity(16);
    super::decimal::push_decimal(&mut out, micros, 6);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const LINE: LineRef<'static> = LineRef {
        budget: "b",
        workload_uid: "u",
        admission: 1,
        flavor: "f",
        resource: "nvidia.com/gpu",
    };

    fn entry(kind: EntryKind, credits: i64, start: i64, end: i64) -> Entry {
        let key = match kind {
            EntryKind::Grant => grant_key("b", start),
            EntryKind::Expiry => expiry_key("b", start),
            EntryKind::Reserve => reserve_key(&LINE, start),
            EntryKind::Post => post_key(&LINE, start, end),
            EntryKind::Void => void_key(&LINE),
            EntryKind::Correction => correction_key("b", "u", 1, start, end, "r"),
        };
        let budget_level = matches!(kind, EntryKind::Grant | EntryKind::Expiry);
        Entry {
            rate: 3_600_000_000,
            key,
            kind,
            budget: "b".into(),
            team: "t".into(),
            namespace: "ns".into(),
            workload: "w".into(),
            workload_uid: if budget_level { "" } else { "u" }.into(),
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
            devices: vec![],
            cluster: String::new(),
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
        e.key = "post/b/u/1/0-11/f/nvidia.com/gpu".into();
        assert!(e.validate().unwrap_err().contains("derived key"));
        // Another line's key is refused; the pre-version-3 joined key is kept.
        e.key = "post/b/u/1/0-10/g/nvidia.com/gpu".into();
        assert!(e.validate().unwrap_err().contains("derived key"));
        e.key = "post/b/u/1/0-10".into();
        assert!(e.validate().is_ok());
        let mut r = entry(EntryKind::Reserve, 5, 100, 200);
        assert_eq!(r.key, "reserve/b/u/1/100/f/nvidia.com/gpu");
        r.key = "reserve/b/u/1/0/f/nvidia.com/gpu".into();
        assert!(r.validate().unwrap_err().contains("derived key"));
        let mut t = entry(EntryKind::Grant, 5, 0, 10);
        t.key = topup_key("b", "q3-extra");
        assert!(t.validate().is_ok());
        for bad in ["topup/other/q3", "topup/b/", "topup/b/x/y"] {
            t.key = bad.into();
            assert!(t.validate().unwrap_err().contains("derived key"), "{bad}");
        }
    }

    /// A store keeps keys unique per workload UID, so an entry whose key names
    /// another workload (or a budget-level entry that names one) is refused.
    #[test]
    fn validate_refuses_a_key_of_another_workload() {
        let mut c = entry(EntryKind::Correction, -5, 0, 10);
        c.key = correction_key("b", "other", 1, 0, 10, "r");
        assert!(
            c.validate()
                .unwrap_err()
                .contains("names workload UID \"other\"")
        );
        let mut g = entry(EntryKind::Grant, 5, 0, 10);
        g.workload_uid = "u".into();
        assert!(
            g.validate()
                .unwrap_err()
                .contains("names workload UID \"\"")
        );
        let mut t = entry(EntryKind::Grant, 5, 0, 10);
        t.key = topup_key("b", "q3-extra");
        assert!(t.validate().is_ok());
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

        /// Every key kaccel derives names the UID it is stored under: the
        /// workload's for its entries, none for a budget's.
        #[test]
        fn keys_name_their_workload(
            k in 0usize..6,
            budget in "[a-z0-9][a-z0-9.-]{0,20}",
            uid in "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
            admission in 1u32..1000,
            start in 0i64..2_000_000_000,
            hours in 0i64..100,
        ) {
            let line = LineRef { budget: &budget, workload_uid: &uid, admission, flavor: "f", resource: "nvidia.com/gpu" };
            let end = start + hours * 3600;
            let (key, named) = match EntryKind::ALL[k] {
                EntryKind::Grant => (grant_key(&budget, start), ""),
                EntryKind::Expiry => (expiry_key(&budget, start), ""),
                EntryKind::Reserve => (reserve_key(&line, start), uid.as_str()),
                EntryKind::Post => (post_key(&line, start, end), uid.as_str()),
                EntryKind::Void => (void_key(&line), uid.as_str()),
                EntryKind::Correction => (correction_key(&budget, &uid, admission, start, end, "why/not"), uid.as_str()),
            };
            prop_assert_eq!(key_workload_uid(&key), named);
            let topup = topup_key(&budget, "x");
            prop_assert_eq!(key_workload_uid(&topup), "");
        }

        /// The part-by-part comparison says what comparing with the built
        /// key says: for the derived key, and for keys one edit away from it
        /// (a character changed, dropped or added anywhere; another number).
        #[test]
        fn key_is_derived_agrees_with_derived_key(
            k in 0usize..6,
            budget in "[a-z0-9-]{0,6}",
            uid in "[0-9a-f-]{0,8}",
            admission in any::<u32>(),
            start in any::<i64>(),
            end in any::<i64>(),
            flavor in "[a-z0-9/-]{0,6}",
            resource in "[a-z0-9./-]{0,8}",
            edit in 0usize..4,
            at in any::<proptest::sample::Index>(),
            ch in "[a-z0-9/-]",
        ) {
            let mut e = entry(EntryKind::ALL[k], 0, start, end);
            (e.budget, e.workload_uid, e.admission, e.flavor, e.resource) =
                (budget, uid, admission, flavor, resource);
            let derived = e.derived_key();
            e.key = derived.clone().unwrap_or_else(|| "correction/x".into());
            let mut chars: Vec<char> = e.key.chars().collect();
            let i = at.index(chars.len() + 1);
            match edit {
                0 => {}
                1 if i < chars.len() => chars[i] = ch.chars().next().unwrap_or('x'),
                2 if i < chars.len() => { chars.remove(i); }
                _ => chars.insert(i, ch.chars().next().unwrap_or('x')),
            }
            e.key = chars.into_iter().collect();
            prop_assert_eq!(e.key_is_derived(), derived.as_deref() == Some(e.key.as_str()), "{}", e.key);
        }

        #[test]
        fn kind_round_trips(k in 0usize..6) {
            let kind = EntryKind::ALL[k];
            prop_assert_eq!(kind.as_str().parse::<EntryKind>(), Ok(kind));
        }
    }
}
