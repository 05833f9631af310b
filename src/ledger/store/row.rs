//! Reading and checking rows, shared by both backends: a raw row into an entry,
//! an entry before it is written, the errors of corrupt or conflicting rows.

use std::collections::BTreeMap;

use super::{OpenReservation, StoreError, StoredEntry};
use crate::ledger::entry::{Entry, EntryKind, line_key};

/// Folds the rows of [`open_reservations_sql`] (one per term, each with the
/// line's posts) into one open reservation per line, in the order of the line's
/// first Reserve.
///
/// [`open_reservations_sql`]: super::schema::open_reservations_sql
pub(super) fn merge_open_lines(rows: Vec<OpenReservation>) -> Vec<OpenReservation> {
    let mut out: Vec<OpenReservation> = Vec::with_capacity(rows.len());
    let mut index: BTreeMap<String, usize> = BTreeMap::new();
    for row in rows {
        let line = line_key(&row.reserve.entry.line());
        match index.get(&line) {
            Some(&i) => {
                let first = &mut out[i];
                first.reserved += row.reserved;
                first.reserved_until = first.reserved_until.max(row.reserved_until);
            }
            None => {
                index.insert(line, out.len());
                out.push(row);
            }
        }
    }
    out
}

/// The error for an aggregated row (a post of an open reservation, an entry of
/// `posted_between`) that the backend's check found corrupt.
pub(super) fn corrupt_aggregated(id: i64, column: &'static str, within: &str) -> StoreError {
    let detail = match column {
        "credits" => format!("not a non-negative integer amount ({within})"),
        _ => format!("not an integer ({within})"),
    };
    StoreError::CorruptRow { id, column, detail }
}

/// The kind of a `GROUP BY budget, kind` row; a bad one is reported on
/// `first_id`, a real row of the group.
pub(super) fn group_kind(first_id: i64, kind: &str, budget: &str) -> Result<EntryKind, StoreError> {
    kind.parse().map_err(|_| StoreError::CorruptRow {
        id: first_id,
        column: "kind",
        detail: format!("{kind:?} is not an entry kind (budget {budget})"),
    })
}

/// Raw column values of a row, before checking (shared by both backends),
/// borrowed from the backend's row: an export or verify of 10M rows decodes
/// each into an entry it reuses ([`fill`](Self::fill)), so a page read into a
/// recycled page allocates nothing once its strings are large enough.
pub(super) struct RawRow<'r> {
    id: i64,
    key: &'r str,
    kind: &'r str,
    budget: &'r str,
    team: &'r str,
    namespace: &'r str,
    workload: &'r str,
    uid: &'r str,
    admission: i64,
    class: &'r str,
    flavor: &'r str,
    resource: &'r str,
    units: i64,
    start: i64,
    end: i64,
    credits: i64,
    rate_card: &'r str,
    reason: &'r str,
    created_at: i64,
    rate: i64,
    devices: &'r str,
    cluster: &'r str,
}

impl<'r> RawRow<'r> {
    /// `id` then [`COLUMNS`] in order, through each backend's typed getters
    /// (which name the column when a row is corrupt).
    ///
    /// [`COLUMNS`]: super::schema::COLUMNS
    pub(super) fn read(
        id: i64,
        text: impl Fn(usize, &'static str) -> Result<&'r str, StoreError>,
        int: impl Fn(usize, &'static str) -> Result<i64, StoreError>,
    ) -> Result<RawRow<'r>, StoreError> {
        Ok(RawRow {
            id,
            key: text(1, "idempotency_key")?,
            kind: text(2, "kind")?,
            budget: text(3, "budget")?,
            team: text(4, "team")?,
            namespace: text(5, "workload_namespace")?,
            workload: text(6, "workload_name")?,
            uid: text(7, "workload_uid")?,
            admission: int(8, "admission")?,
            class: text(9, "class")?,
            flavor: text(10, "flavor")?,
            resource: text(11, "resource")?,
            units: int(12, "device_units")?,
            start: int(13, "interval_start")?,
            end: int(14, "interval_end")?,
            credits: int(15, "credits")?,
            rate_card: text(16, "rate_card")?,
            reason: text(17, "reason")?,
            created_at: int(18, "created_at")?,
            rate: int(19, "rate")?,
            devices: text(20, "devices")?,
            cluster: text(21, "cluster")?,
        })
    }

    pub(super) fn into_entry(self) -> Result<StoredEntry, StoreError> {
        let mut stored = StoredEntry {
            id: self.id,
            entry: Entry::empty(),
        };
        self.fill(&mut stored)?;
        Ok(stored)
    }

    /// Checks the row and puts it at position `at` of a page being decoded
    /// (positions in order from 0): over the entry a recycled page holds
    /// there, or pushed where the page is shorter.
    pub(super) fn put(self, page: &mut Vec<StoredEntry>, at: usize) -> Result<(), StoreError> {
        match page.get_mut(at) {
            Some(reused) => self.fill(reused),
            None => {
                page.push(self.into_entry()?);
                Ok(())
            }
        }
    }

    /// Checks the row and writes it over `target`, reusing its strings'
    /// buffers. On an error `target` is left part written.
    fn fill(self, target: &mut StoredEntry) -> Result<(), StoreError> {
        let id = self.id;
        let corrupt = |column, detail: String| StoreError::CorruptRow { id, column, detail };
        let kind: EntryKind = self
            .kind
            .parse()
            .map_err(|_| corrupt("kind", format!("{:?} is not an entry kind", self.kind)))?;
        let admission = u32::try_from(self.admission).map_err(|_| {
            corrupt(
                "admission",
                format!("{} is not an admission number", self.admission),
            )
        })?;
        let device_units = u64::try_from(self.units)
            .map_err(|_| corrupt("device_units", format!("{} is negative", self.units)))?;
        if self.credits < 0 && kind != EntryKind::Correction {
            return Err(corrupt(
                "credits",
                format!("{} is negative on a {kind} entry", self.credits),
            ));
        }
        if self.key.is_empty() {
            return Err(corrupt("idempotency_key", "empty".into()));
        }
        let rate = u64::try_from(self.rate)
            .map_err(|_| corrupt("rate", format!("{} is negative", self.rate)))?;
        target.id = id;
        let e = &mut target.entry;
        for (field, value) in [
            (&mut e.key, self.key),
            (&mut e.budget, self.budget),
            (&mut e.team, self.team),
            (&mut e.namespace, self.namespace),
            (&mut e.workload, self.workload),
            (&mut e.workload_uid, self.uid),
            (&mut e.class, self.class),
            (&mut e.flavor, self.flavor),
            (&mut e.resource, self.resource),
            (&mut e.rate_card, self.rate_card),
            (&mut e.reason, self.reason),
            (&mut e.cluster, self.cluster),
        ] {
            field.clear();
            field.push_str(value);
        }
        e.kind = kind;
        e.admission = admission;
        e.device_units = device_units;
        e.start = self.start;
        e.end = self.end;
        e.credits = self.credits;
        e.created_at = self.created_at;
        e.rate = rate;
        let mut held = 0;
        for device in self.devices.split(',').filter(|d| !d.is_empty()) {
            match e.devices.get_mut(held) {
                Some(reused) => {
                    reused.clear();
                    reused.push_str(device);
                }
                None => e.devices.push(device.to_string()),
            }
            held += 1;
        }
        e.devices.truncate(held);
        Ok(())
    }
}

pub(super) fn check(e: &Entry) -> Result<(), StoreError> {
    e.validate().map_err(|reason| StoreError::InvalidEntry {
        key: e.key.clone(),
        reason,
    })
}

pub(super) fn conflict(stored: &Entry, new: &Entry) -> StoreError {
    StoreError::KeyConflict {
        key: new.key.clone(),
        stored: serde_json::to_string(stored).unwrap_or_default(),
        new: serde_json::to_string(new).unwrap_or_default(),
    }
}
